"""``python -m cachalot_torch``: what is installed, and whether it works here.

Checks, in order: the Rust library loads and accepts ``CACHALOT_ALLOC_CONF``;
torch is importable; the C++ allocator compiles against it; on a machine with a
GPU, cachalot installs, serves a tensor and answers ``torch.cuda.memory_stats``.
Exits 1 when a check fails, 0 otherwise (a missing GPU or torch is not a failure:
it is said)."""

import os
import sys

import cachalot_torch


def _row(label, value):
    print(f"{label:<22}{value}")


def main():
    _row("cachalot_torch", f"{cachalot_torch.__version__} ({os.path.dirname(cachalot_torch.__file__)})")
    try:
        _row("library", cachalot_torch.library_path())
        conf = cachalot_torch.config()
    except (cachalot_torch.CachalotError, OSError) as e:
        _row("library", f"FAILED: {e}")
        return 1
    _row("policy", conf["policy"])
    _row("settings", conf["conf"] or "(defaults)")
    try:
        import torch
    except ImportError:
        _row("torch", "not installed: nothing more to check")
        return 0
    _row("torch", f"{torch.__version__} (CUDA {torch.version.cuda})")
    from cachalot_torch import _extension

    try:
        _extension.load(cachalot_torch.library_path())
        _row("C++ allocator", "compiled")
    except Exception as e:  # noqa: BLE001 - any build failure is the answer
        _row("C++ allocator", f"FAILED to compile: {e}")
        return 1
    if not torch.cuda.is_available():
        _row("GPU", "none: cachalot installs on a machine with a CUDA device")
        return 0
    cachalot_torch.use()
    x = torch.ones(1 << 20, device="cuda")
    allocated = torch.cuda.memory_allocated()
    del x
    cachalot_torch.validate()
    ok = cachalot_torch.installed() and allocated == 4 << 20
    _row("GPU", f"{torch.cuda.get_device_name()}: {'works' if ok else 'FAILED'} (allocated {allocated} bytes for 4 MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""``python -m cachalot_torch``: what is installed, and whether it works here.

Says, in order: the Rust library and the settings it reads; the C++
allocators this wheel carries prebuilt; torch, and where its allocator comes
from (prebuilt, compiled here before, or compiled on first use, with what,
or why it cannot be); on a machine with a GPU, cachalot installs, serves a
tensor and answers ``torch.cuda.memory_stats``. Exits 1 when a check fails, 0
otherwise (a missing GPU or torch is said, not failed)."""

import os
import sys

import cachalot_torch
from cachalot_torch import _build, _extension


def _row(label, value):
    print(f"{label:<22}{value}")


def _library():
    """The Rust library and its settings; False when it fails."""
    try:
        _row("library", cachalot_torch.library_path())
        conf = cachalot_torch.config()
    except (cachalot_torch.CachalotError, OSError) as e:
        _row("library", f"FAILED: {e}")
        return False
    _row("policy", conf["policy"])
    _row("settings", conf["conf"] or "(defaults)")
    _row("segments", f"{conf['segments']} (segments:auto|driver|runtime)")
    return True


def _prebuilt():
    builds = _extension.prebuilt()
    for build in builds:
        _row("prebuilt", f"{build['key']}: built against torch {build['torch']}, CUDA {build['cuda']} headers, "
                         f"{build['compiler']}")
    if not builds:
        _row("prebuilt", "none: the allocator compiles on first use")


def _allocator():
    """Where the allocator for the installed torch comes from; False when it
    cannot be had."""
    try:
        chosen = _extension.plan(_build.Torch.imported(), cachalot_torch.library_path())
    except cachalot_torch.SetupError as e:
        _row("C++ allocator", f"CANNOT BE HAD: {str(e).removeprefix('cachalot_torch: ')}")
        return False
    if chosen.source == "compile":
        _row("C++ allocator", f"compiles on first use (once) with {chosen.command[0]}, CUDA {chosen.cuda.version} "
                              f"from {chosen.cuda.where}, into {chosen.path.parent}")
    else:
        _row("C++ allocator", f"{chosen.source}: {chosen.path}")
    return True


def _gpu(torch):
    """Installs cachalot and serves a tensor; False when that fails."""
    if not torch.cuda.is_available():
        _row("GPU", "none: cachalot installs on a machine with a CUDA device")
        return True
    try:
        cachalot_torch.use()
    except cachalot_torch.CachalotError as e:
        _row("GPU", f"FAILED: {e}")
        return False
    x = torch.ones(1 << 20, device="cuda")
    allocated = torch.cuda.memory_allocated()
    del x
    cachalot_torch.validate()
    ok = cachalot_torch.installed() and allocated == 4 << 20
    verdict = "works" if ok else "FAILED"
    _row("GPU", f"{torch.cuda.get_device_name()}: {verdict} (allocated {allocated} bytes for 4 MiB)")
    return ok


def main():
    _row("cachalot_torch", f"{cachalot_torch.__version__} ({os.path.dirname(cachalot_torch.__file__)})")
    if not _library():
        return 1
    _prebuilt()
    try:
        import torch
    except ImportError:
        _row("torch", "not installed: `pip install torch` (a CUDA build)")
        return 0
    _row("torch", f"{torch.__version__} (CUDA {torch.version.cuda}) in {os.path.dirname(torch.__file__)}")
    if not _allocator():
        return 1
    return 0 if _gpu(torch) else 1


if __name__ == "__main__":
    sys.exit(main())

"""cachalot as PyTorch's CUDA allocator, with nothing lost.

Before anything touches CUDA::

    import cachalot_torch
    cachalot_torch.use()                      # or use(conf="policy:cachalot")
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.memory_allocated()             # answered by cachalot

:func:`use` loads a small C++ subclass of PyTorch's ``CUDAAllocator`` and makes
it PyTorch's CUDA allocator: the one the wheel carries prebuilt for its torch
release (``python -m cachalot_torch`` says which), else one compiled against the
installed torch on first use (once, into ``~/.cache/cachalot_torch``). Every
``torch.cuda`` memory function then reads cachalot: ``memory_stats``, ``memory_summary``, ``max_memory_allocated``,
``reset_peak_memory_stats``, ``empty_cache``, ``_record_memory_history``,
``_snapshot``, ``_dump_snapshot``; running out of memory raises
``torch.cuda.OutOfMemoryError`` with cachalot's breakdown.

Settings: PyTorch's own (``PYTORCH_ALLOC_CONF``, else ``PYTORCH_CUDA_ALLOC_CONF``),
then ``conf`` or ``CACHALOT_ALLOC_CONF`` over them (the same syntax plus
``policy:pytorch|cachalot`` and the cachalot policy's keys), read once, when the
library first serves; ``torch.cuda.memory._set_allocator_settings`` changes them
while the program runs, as in PyTorch.
``python -m cachalot_torch`` prints what is installed and checks it.

Sleep and wake (:mod:`cachalot_torch.sleep`): ``with region("weights", backup="host"):``
tags allocations; ``pause()`` gives their memory back to the device and
``resume()`` brings it back at the same addresses.
"""

import ctypes
import json
import os
import pathlib
import sys

__version__ = "0.1.0"
__all__ = [
    "use",
    "installed",
    "config",
    "validate",
    "library_path",
    "region",
    "pause",
    "resume",
    "cuda_graph",
    "tags",
    "CachalotError",
    "SetupError",
]

_LIB_NAME = "libcachalot_torch.so"
_CONF_VAR = "CACHALOT_ALLOC_CONF"
_lib = None


class CachalotError(RuntimeError):
    """cachalot refused: a bad configuration, a missing library, a broken invariant."""


class SetupError(CachalotError):
    """This machine lacks what cachalot needs (torch, a compiler, CUDA's headers,
    Rust to build from source): the message says what to install."""


def library_path():
    """The Rust library: ``$CACHALOT_TORCH_LIB``, the one installed with this
    package, or, in a checkout, the repository's ``target/release``."""
    override = os.environ.get("CACHALOT_TORCH_LIB")
    if override:
        return str(pathlib.Path(override).resolve())
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (here / _LIB_NAME, here.parent.parent / "target" / "release" / _LIB_NAME):
        if candidate.exists():
            return str(candidate)
    raise CachalotError(
        f"{_LIB_NAME} is not installed next to {here}: reinstall the cachalot-torch wheel "
        "(scripts/build-wheels.sh builds it from a checkout), or set CACHALOT_TORCH_LIB"
    )


def _load():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path(), mode=ctypes.RTLD_GLOBAL)
        lib.cachalot_init.restype = ctypes.c_int
        lib.cachalot_last_error.restype = ctypes.c_void_p
        lib.cachalot_config.restype = ctypes.c_void_p
        lib.cachalot_string_free.argtypes = [ctypes.c_void_p]
        lib.cachalot_validate.argtypes = [ctypes.c_int]
        lib.cachalot_validate.restype = ctypes.c_int
        _lib = lib
    return _lib


def _take(ptr):
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        _load().cachalot_string_free(ptr)


def _check(status, what):
    if status != 0:
        raise CachalotError(f"cachalot: {what}: {_take(_load().cachalot_last_error()) or 'failed'}")


def use(conf=None, *, verbose=False):
    """Makes cachalot PyTorch's CUDA allocator. Call it before anything
    initializes CUDA (the first CUDA tensor, ``torch.cuda.init()``).

    ``conf`` sets ``CACHALOT_ALLOC_CONF`` for this process; ``verbose`` shows
    the compiler's call and output when the allocator is compiled. Raises
    :class:`SetupError` when torch is missing or the allocator cannot be had
    here (the message says what to install), :class:`CachalotError` for a
    configuration cachalot refuses or once PyTorch's own allocator is in use."""
    if conf is not None:
        current = os.environ.get(_CONF_VAR)
        if _lib is not None and current is not None and current != conf:
            raise CachalotError(f"cachalot already runs with {_CONF_VAR}={current!r}; cannot switch to {conf!r}")
        os.environ[_CONF_VAR] = conf
    if installed():
        return
    torch = _import_torch()
    if torch.cuda.is_initialized():
        raise CachalotError(
            "cachalot_torch.use() must run before PyTorch initializes CUDA, and this process "
            "initialized it already (a CUDA tensor, torch.cuda.init(), current_device() or "
            "memory_stats()): call use() first, right after `import torch`"
        )
    lib = _load()
    _check(lib.cachalot_init(), f"{_CONF_VAR}={os.environ.get(_CONF_VAR, '')!r}")
    from . import _extension

    try:
        _extension.install(library_path(), verbose=verbose)
    except SetupError as e:
        raise e.with_traceback(None) from None  # the message is the news, not the frames inside


def _import_torch():
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name != "torch":
            raise
        raise SetupError(
            f"cachalot_torch.use() needs PyTorch, which this Python ({sys.executable}) lacks: "
            "`pip install torch` (a CUDA build; this wheel's prebuilt allocators: "
            "`python -m cachalot_torch`)"
        ) from None
    return torch


def installed():
    """Whether cachalot serves this process's CUDA allocations."""
    from . import _extension

    return _extension.installed()


def config():
    """The configuration in force: ``{"policy": ..., "conf": ..., "segments": ...}``
    (``segments``: ``"driver"`` or ``"runtime"``, where segments come from)."""
    lib = _load()
    text = _take(lib.cachalot_config())
    if text is None:
        _check(-1, "config")
    return json.loads(text)


def validate(device=None):
    """Checks every invariant of ``device``'s allocator (the current device by
    default); raises :class:`CachalotError` on a violation."""
    if device is None:
        import torch

        device = torch.cuda.current_device()
    _check(_load().cachalot_validate(int(device)), f"validate(device {device})")


# Sleep and wake of tagged memory (cachalot_torch.region, pause, resume).
from .sleep import cuda_graph, pause, region, resume, tags  # noqa: E402

"""cachalot as PyTorch's CUDA allocator, with nothing lost.

Before anything touches CUDA::

    import cachalot_torch
    cachalot_torch.use()                      # or use(conf="policy:cachalot")
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.memory_allocated()             # answered by cachalot

:func:`use` compiles (once, cached by ``torch.utils.cpp_extension``) a small C++
subclass of PyTorch's ``CUDAAllocator`` against the installed torch and makes it
PyTorch's CUDA allocator. Every ``torch.cuda`` memory function then reads
cachalot: ``memory_stats``, ``memory_summary``, ``max_memory_allocated``,
``reset_peak_memory_stats``, ``empty_cache``, ``_record_memory_history``,
``_snapshot``, ``_dump_snapshot``; running out of memory raises
``torch.cuda.OutOfMemoryError`` with cachalot's breakdown.

Settings: PyTorch's own (``PYTORCH_ALLOC_CONF``, else ``PYTORCH_CUDA_ALLOC_CONF``),
then ``conf`` or ``CACHALOT_ALLOC_CONF`` over them (the same syntax plus
``policy:pytorch|cachalot`` and the cachalot policy's keys), read once, when the
library first serves; ``torch.cuda.memory._set_allocator_settings`` changes them
while the program runs, as in PyTorch.
``python -m cachalot_torch`` prints what is installed and checks it.
"""

import ctypes
import json
import os
import pathlib

__version__ = "0.1.0"
__all__ = ["use", "installed", "config", "validate", "library_path", "CachalotError"]

_LIB_NAME = "libcachalot_torch.so"
_CONF_VAR = "CACHALOT_ALLOC_CONF"
_lib = None


class CachalotError(RuntimeError):
    """cachalot refused: a bad configuration, a missing library, a broken invariant."""


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
        f"{_LIB_NAME} is not installed next to {here}: install the package with "
        "`pip install ./python` from a cachalot checkout, or set CACHALOT_TORCH_LIB"
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

    ``conf`` sets ``CACHALOT_ALLOC_CONF`` for this process. Raises
    :class:`CachalotError` for a configuration cachalot refuses, and
    ``RuntimeError`` when PyTorch's own allocator is already in use."""
    if conf is not None:
        current = os.environ.get(_CONF_VAR)
        if _lib is not None and current is not None and current != conf:
            raise CachalotError(f"cachalot already runs with {_CONF_VAR}={current!r}; cannot switch to {conf!r}")
        os.environ[_CONF_VAR] = conf
    lib = _load()
    _check(lib.cachalot_init(), f"{_CONF_VAR}={os.environ.get(_CONF_VAR, '')!r}")
    from . import _extension

    _extension.load(library_path(), verbose=verbose).install()


def installed():
    """Whether cachalot serves this process's CUDA allocations."""
    from . import _extension

    ext = _extension.loaded()
    return ext is not None and ext.installed()


def config():
    """The configuration in force: ``{"policy": ..., "conf": ...}``."""
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

"""cachalot as PyTorch's CUDA allocator, with PyTorch's memory statistics.

Pure ctypes: build the library with ``cargo build --release -p cachalot-torch``,
then, before anything allocates CUDA memory::

    import cachalot_torch
    cachalot_torch.use()                      # or use(conf="policy:cachalot")
    x = torch.randn(1 << 20, device="cuda")
    cachalot_torch.memory_allocated()         # 4 MiB
    print(cachalot_torch.memory_summary())

Once installed, PyTorch's own ``torch.cuda.memory_stats()`` and friends raise
("CUDAPluggableAllocator does not yet support getDeviceStats"); the functions of
this module answer instead, with PyTorch's key names. ``torch.cuda.empty_cache()``,
``torch.cuda.set_per_process_memory_fraction()`` and ``Tensor.record_stream()``
keep working: :func:`use` installs cachalot's hooks for them.

Settings come from ``CACHALOT_ALLOC_CONF`` (``PYTORCH_CUDA_ALLOC_CONF`` syntax plus
``policy:pytorch|cachalot``), read once, when the library first serves a call.
The library is found at ``$CACHALOT_TORCH_LIB``, next to this file, or in the
repository's ``target/release`` (then ``target/debug``).
"""

import collections
import ctypes
import json
import os
import pathlib

__all__ = [
    "library_path",
    "load",
    "use",
    "installed",
    "hooks",
    "config",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_summary",
    "empty_cache",
    "record_memory_history",
    "dump_snapshot",
    "validate",
    "last_error",
    "CachalotError",
]

_LIB_NAME = "libcachalot_torch.so"
_lib = None
_lib_path = None
_allocator = None  # the torch CUDAPluggableAllocator, kept alive here
_hooks = []  # the PyTorch hooks use() installed


class CachalotError(RuntimeError):
    """A call into cachalot failed; the message is cachalot's."""


def library_path(path=None):
    """The shared library to load: ``path``, ``$CACHALOT_TORCH_LIB``, next to this
    file, or the repository's ``target/release`` or ``target/debug``."""
    if path is None:
        path = os.environ.get("CACHALOT_TORCH_LIB")
    if path is not None:
        return str(pathlib.Path(path).resolve())
    here = pathlib.Path(__file__).resolve().parent
    for candidate in (
        here / _LIB_NAME,
        here.parent / "target" / "release" / _LIB_NAME,
        here.parent / "target" / "debug" / _LIB_NAME,
    ):
        if candidate.exists():
            return str(candidate)
    raise FileNotFoundError(
        f"{_LIB_NAME} not found next to {here} or in target/; "
        "run `cargo build --release -p cachalot-torch` or set CACHALOT_TORCH_LIB"
    )


def _declare(lib):
    c_int, c_void_p, c_char_p = ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    signatures = {
        "cachalot_init": (c_int, []),
        "cachalot_alloc": (c_void_p, [ctypes.c_ssize_t, c_int, c_void_p]),
        "cachalot_free": (None, [c_void_p, ctypes.c_ssize_t, c_int, c_void_p]),
        "cachalot_record_stream": (None, [c_void_p, c_void_p]),
        "cachalot_empty_cache": (None, []),
        "cachalot_set_memory_fraction": (None, [ctypes.c_double, c_int]),
        # Strings come back as raw pointers so that they can be freed.
        "cachalot_memory_stats": (c_void_p, [c_int]),
        "cachalot_memory_summary": (c_void_p, [c_int, c_int]),
        "cachalot_config": (c_void_p, []),
        "cachalot_last_error": (c_void_p, []),
        "cachalot_clear_last_error": (None, []),
        "cachalot_string_free": (None, [c_void_p]),
        "cachalot_reset_peak_stats": (c_int, [c_int]),
        "cachalot_reset_accumulated_stats": (c_int, [c_int]),
        "cachalot_validate": (c_int, [c_int]),
        "cachalot_record_history": (c_int, [c_int, ctypes.c_size_t]),
        "cachalot_dump_snapshot": (c_int, [c_char_p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def load(path=None):
    """Loads (once) and returns the library, without installing it into torch."""
    global _lib, _lib_path
    if _lib is None:
        _lib_path = library_path(path)
        lib = ctypes.CDLL(_lib_path)
        _declare(lib)
        _lib = lib
    return _lib


def _take_string(ptr):
    """Copies a string the library returned, then frees it."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", errors="replace")
    finally:
        _lib.cachalot_string_free(ptr)


def last_error():
    """The message of cachalot's last failure (in any thread), or None."""
    return _take_string(load().cachalot_last_error())


def _fail(what):
    raise CachalotError(f"{what}: {last_error() or 'unknown error'}")


def _check_status(status, what):
    if status != 0:
        _fail(what)


def _check_void(call, what, *args):
    """Runs a library function that returns nothing and reports failure through
    the last error."""
    lib = load()
    lib.cachalot_clear_last_error()
    call(*args)
    if last_error() is not None:
        _fail(what)


def _string(ptr, what):
    text = _take_string(ptr)
    if text is None:
        _fail(what)
    return text


def use(path=None, conf=None):
    """Installs cachalot as torch's CUDA allocator. Call it before anything
    allocates CUDA memory (PyTorch refuses to swap an allocator in use).

    ``conf``, when given, replaces ``CACHALOT_ALLOC_CONF`` (for example
    ``"policy:cachalot"`` or ``"expandable_segments:True"``)."""
    global _allocator
    import torch

    if _allocator is not None:
        return _allocator
    if conf is not None:
        os.environ["CACHALOT_ALLOC_CONF"] = conf
    lib = load(path)
    _check_status(lib.cachalot_init(), "cachalot configuration")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "cachalot_alloc", "cachalot_free")
    hooks = allocator.allocator()
    for setter, function in (
        ("set_record_stream_fn", "cachalot_record_stream"),
        ("set_reset_fn", "cachalot_empty_cache"),
        ("set_memory_fraction_fn", "cachalot_set_memory_fraction"),
    ):
        install = getattr(hooks, setter, None)
        if install is not None:
            install(ctypes.cast(getattr(lib, function), ctypes.c_void_p).value)
            _hooks.append(setter)
    torch.cuda.memory.change_current_allocator(allocator)
    _allocator = allocator
    return allocator


def installed():
    """Whether :func:`use` has installed cachalot in this process."""
    return _allocator is not None


def hooks():
    """The PyTorch hooks :func:`use` installed (``set_record_stream_fn``,
    ``set_reset_fn``, ``set_memory_fraction_fn`` where this PyTorch has them)."""
    return list(_hooks)


def config():
    """The configuration in force: ``{"policy": ..., "conf": ...}``."""
    return json.loads(_string(load().cachalot_config(), "config"))


def _device_index(device):
    if isinstance(device, int):
        return device
    import torch

    if device is None:
        return torch.cuda.current_device()
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def memory_stats(device=None):
    """``torch.cuda.memory_stats``: PyTorch's flattened keys, sorted."""
    text = _string(load().cachalot_memory_stats(_device_index(device)), "memory_stats")
    return collections.OrderedDict(sorted(json.loads(text).items()))


def memory_allocated(device=None):
    """Bytes in allocated blocks."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    """The peak of :func:`memory_allocated` since the last peak reset."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    """Bytes in segments obtained from the device."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    """The peak of :func:`memory_reserved` since the last peak reset."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """Sets every peak statistic to its current value."""
    _check_status(load().cachalot_reset_peak_stats(_device_index(device)), "reset_peak_memory_stats")


def reset_accumulated_memory_stats(device=None):
    """Zeroes every cumulative statistic."""
    _check_status(load().cachalot_reset_accumulated_stats(_device_index(device)), "reset_accumulated_memory_stats")


def memory_summary(device=None, abbreviated=False):
    """PyTorch's ``memory_summary`` table."""
    return _string(load().cachalot_memory_summary(_device_index(device), int(abbreviated)), "memory_summary")


def empty_cache():
    """Returns every device's cached, unused memory to the driver."""
    _check_void(load().cachalot_empty_cache, "empty_cache")


def record_memory_history(enabled=True, max_entries=0):
    """Starts or stops recording allocator events on every device, keeping at most
    ``max_entries`` per device (0: unlimited)."""
    _check_status(load().cachalot_record_history(int(bool(enabled)), int(max_entries)), "record_memory_history")


def dump_snapshot(path):
    """Writes a PyTorch snapshot pickle (``torch.cuda.memory._dump_snapshot``'s
    format) of every device to ``path``."""
    _check_status(load().cachalot_dump_snapshot(os.fsencode(path)), "dump_snapshot")


def validate(device=None):
    """Checks every invariant of the device's allocator; raises on a violation."""
    _check_status(load().cachalot_validate(_device_index(device)), "validate")

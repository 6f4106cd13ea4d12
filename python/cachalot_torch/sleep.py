"""Sleep and wake: tagged memory given back to the device and brought back at
the same addresses.

Allocations made inside :func:`region` (or by a CUDA graph captured with
:func:`cuda_graph`) carry a tag. :func:`pause` gives every page of a tag back
to the driver, its virtual addresses kept reserved, after copying the bytes to
pinned host memory when the region asked for ``backup="host"``; the tag's
cached free memory is released too. :func:`resume` maps new pages at the same
addresses and copies the backups back, so tensors and captured graphs stay
valid::

    import cachalot_torch
    cachalot_torch.use(conf="policy:pytorch")
    with cachalot_torch.region("weights", backup="host"):
        model = build_model().cuda()
    with cachalot_torch.region("kv_cache"):
        cache = torch.empty(..., device="cuda")
    cachalot_torch.pause()            # every tag: the device is free for the trainer
    ...
    cachalot_torch.resume()           # weights restored, KV cache to be refilled

A tag is one ``torch.cuda.MemPool`` per device and backup, made a tag before its
first allocation; :func:`tags` lists them and where each stands. Served under
the pytorch policy; the cachalot policy says it cannot yet.

:data:`torch_memory_saver` has the shape of the ``torch_memory_saver`` package's
object (``region(tag=..., enable_cpu_backup=...)``, ``pause``, ``resume``,
``cuda_graph``), so a program using it switches with its import line::

    from cachalot_torch.sleep import torch_memory_saver
"""

import contextlib
import ctypes
import json
import threading

from . import CachalotError, _check, _import_torch, _load, _take

__all__ = ["region", "pause", "resume", "cuda_graph", "tags", "TorchMemorySaver", "torch_memory_saver"]

_BACKUPS = {None: 0, "host": 1}
_pools = {}
_pools_lock = threading.Lock()


def _lib():
    lib = _load()
    if not getattr(lib, "_cachalot_sleep_typed", False):
        lib.cachalot_tag_add.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]
        lib.cachalot_tag_add.restype = ctypes.c_int
        lib.cachalot_tag_pause.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.cachalot_tag_pause.restype = ctypes.c_void_p
        lib.cachalot_tag_resume.argtypes = [ctypes.c_char_p]
        lib.cachalot_tag_resume.restype = ctypes.c_void_p
        lib.cachalot_tags.restype = ctypes.c_void_p
        lib._cachalot_sleep_typed = True
    return lib


def _name(tag):
    if tag is None:
        return None
    if not isinstance(tag, str) or not tag:
        raise CachalotError(f"cachalot: a tag is a non-empty string, not {tag!r}")
    return tag.encode("utf-8")


def _backup_code(backup):
    if backup not in _BACKUPS:
        raise CachalotError(f"cachalot: backup must be None or 'host', not {backup!r}")
    return _BACKUPS[backup]


def _json(ptr, what):
    text = _take(ptr)
    if text is None:
        _check(-1, what)
    return json.loads(text)


def pool(tag, backup=None, device=None):
    """The ``torch.cuda.MemPool`` of ``tag`` with ``backup`` on ``device`` (the
    current device by default), made and registered as a tag on first use."""
    torch = _import_torch()
    index = torch.cuda.current_device() if device is None else torch.device("cuda", device).index
    if index is None:
        index = torch.cuda.current_device()
    key = (tag, backup, index)
    with _pools_lock:
        found = _pools.get(key)
        if found is not None:
            return found
        code = _backup_code(backup)
        name = _name(tag)
        with torch.cuda.device(index):
            made = torch.cuda.MemPool()
        _check(_lib().cachalot_tag_add(name, index, made.id[0], made.id[1], code), f"region({tag!r})")
        _pools[key] = made
        return made


@contextlib.contextmanager
def region(tag="default", backup=None, device=None):
    """Allocations on ``device`` inside the block carry ``tag``; ``backup="host"``
    keeps their bytes in pinned host memory while the tag is paused."""
    torch = _import_torch()
    chosen = pool(tag, backup, device)
    with torch.cuda.use_mem_pool(chosen, device=device):
        yield chosen


def pause(tag=None, synchronize=True):
    """Gives the memory of ``tag`` (every awake tag: ``None``) back to the
    device. ``synchronize`` waits for the device first; ``False`` refuses while
    queued work may still use the memory. Returns what was done: ``pools``,
    ``segments``, ``bytes``, ``copied`` (backed up) and ``released`` (cached
    memory given back for good)."""
    return _json(_lib().cachalot_tag_pause(_name(tag), 1 if synchronize else 0), f"pause({tag!r})")


def resume(tag=None):
    """Brings the memory of ``tag`` (every paused tag: ``None``) back at the
    same addresses, its backups copied back. Returns what was done, as
    :func:`pause`."""
    return _json(_lib().cachalot_tag_resume(_name(tag)), f"resume({tag!r})")


def tags():
    """Every tag's pools and where each stands: ``tag``, ``device``, ``pool``,
    ``backup``, ``paused``, ``segments``, ``bytes``, ``paused_bytes``,
    ``host_bytes``."""
    return _json(_lib().cachalot_tags(), "tags()")


@contextlib.contextmanager
def cuda_graph(graph, tag="default", backup=None, stream=None, capture_error_mode="global"):
    """``torch.cuda.graph(graph, ...)`` with the graph's memory in ``tag``: the
    graph's pool sleeps and wakes with the tag, and the graph replays after a
    resume."""
    torch = _import_torch()
    chosen = pool(tag, backup)
    with torch.cuda.graph(graph, pool=chosen.id, stream=stream, capture_error_mode=capture_error_mode):
        yield graph


class TorchMemorySaver:
    """The ``torch_memory_saver`` package's interface over cachalot's tags."""

    def region(self, tag="default", enable_cpu_backup=False):
        return region(tag, "host" if enable_cpu_backup else None)

    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag="default", enable_cpu_backup=False):
        if pool is not None:
            raise CachalotError("cachalot: cuda_graph takes its pool from the tag; pass tag=..., not pool=...")
        return cuda_graph(cuda_graph, tag, "host" if enable_cpu_backup else None, stream, capture_error_mode)

    def pause(self, tag=None):
        pause(tag)

    def resume(self, tag=None):
        resume(tag)

    @property
    def enabled(self):
        return True


torch_memory_saver = TorchMemorySaver()

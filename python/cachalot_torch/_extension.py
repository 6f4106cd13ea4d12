"""The C++ allocator for the installed torch: the one this wheel carries
prebuilt for its release (``prebuilt/torch2.11-cu13/``), else one compiled
against it on first use into a cache (``$XDG_CACHE_HOME/cachalot_torch``,
``~/.cache`` by default), loaded into the process."""

import ctypes
import dataclasses
import json
import os
import pathlib
import sys
import time

from . import CachalotError, SetupError, __version__, _build

PREBUILT = pathlib.Path(__file__).resolve().parent / "prebuilt"
_library = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where the allocator for a torch comes from: ``prebuilt`` (in this
    wheel), ``cached`` (compiled here before) or ``compile`` (now, with
    ``command`` and the ``cuda`` it found)."""

    source: str
    path: pathlib.Path
    command: tuple = ()
    cuda: _build.Cuda = None


def prebuilt():
    """The allocators this wheel carries: each build's record (``torch``,
    ``cuda``, ``compiler``) with its ``key``."""
    return [{**json.loads(m.read_text()), "key": m.parent.name} for m in sorted(PREBUILT.glob("*/build.json"))]


def cache_root():
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "cachalot_torch"


def plan(torch, library):
    """How the allocator for ``torch`` is had. Raises :class:`SetupError` with
    the fix when it must be compiled and this machine cannot."""
    shipped = torch.key and PREBUILT / torch.key / _build.OUTPUT
    if shipped and shipped.exists():
        return Plan("prebuilt", shipped)
    name = f"{__version__}-torch{torch.version}-{_build.fingerprint(torch.version, torch.cuda)}"
    cached = cache_root() / name / _build.OUTPUT
    if cached.exists():
        return Plan("cached", cached)
    return _compile_plan(torch, library, cached)


def _compile_plan(torch, library, output):
    try:
        cxx = _build.find_compiler()
        cuda = _build.find_cuda(torch.cuda)
    except SetupError as e:
        carried = ", ".join(build["key"] for build in prebuilt())
        shipped = f"carries the allocator prebuilt for {carried} only" if carried else "carries no prebuilt allocator"
        raise SetupError(f"cachalot_torch: this installation {shipped}, so under torch {torch.version} it "
                         f"compiles on first use: {e}") from None
    libdir = pathlib.Path(library).parent
    return Plan("compile", output, tuple(_build.command(cxx, torch, cuda, libdir, rpath=str(libdir))), cuda)


def _compile(chosen, torch, verbose):
    print(f"cachalot_torch: compiling the C++ allocator for torch {torch.version}, once (none is prebuilt "
          f"for it), into {chosen.path.parent}", file=sys.stderr, flush=True)
    start = time.monotonic()
    _build.compile_to(list(chosen.command), chosen.path, verbose)
    print(f"cachalot_torch: compiled in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


def _open(path):
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise SetupError(f"cachalot_torch: the C++ allocator {path} does not load into this process ({e}): "
                         "import torch from the environment cachalot_torch is installed in") from None
    lib.cachalot_allocator_install.restype = ctypes.c_char_p
    lib.cachalot_allocator_installed.restype = ctypes.c_int
    return lib


def load(library, verbose=False):
    """The allocator's library for the installed torch, compiled first if it
    must be. ``library`` is the Rust library it links."""
    global _library
    if _library is None:
        torch = _build.Torch.imported()
        chosen = plan(torch, library)
        if chosen.source == "compile":
            _compile(chosen, torch, verbose)
        _library = _open(chosen.path)
    return _library


def install(library, verbose=False):
    """Makes the allocator PyTorch's; raises :class:`CachalotError` with
    PyTorch's reason when it refuses."""
    reason = load(library, verbose).cachalot_allocator_install()
    if reason is not None:
        raise CachalotError(reason.decode("utf-8", "replace"))


def installed():
    """Whether this process's allocator is PyTorch's."""
    return _library is not None and _library.cachalot_allocator_installed() == 1

"""Compiles the C++ allocator against the installed torch, once per torch and
cachalot version (``torch.utils.cpp_extension``'s cache), and loads it."""

import importlib.util
import os
import pathlib

_SOURCE = pathlib.Path(__file__).resolve().parent / "csrc" / "cachalot_allocator.cpp"
_module = None


def _cuda_include():
    """CUDA's headers: the toolkit (``CUDA_HOME``, ``/usr/local/cuda``) or the
    NVIDIA wheels that torch installs."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    roots = [pathlib.Path(c) / "include" for c in candidates if c]
    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        roots.extend(sorted(pathlib.Path(base).glob("cu*/include")))
        roots.append(pathlib.Path(base) / "cuda_runtime" / "include")
    for root in roots:
        if (root / "cuda_runtime_api.h").exists():
            return str(root)
    raise RuntimeError(
        "cachalot_torch: CUDA's headers (cuda_runtime_api.h) were not found: set CUDA_HOME "
        "to a CUDA toolkit, or install the nvidia-cuda-runtime wheel matching torch"
    )


def _name():
    import torch

    from . import __version__

    tag = f"{__version__}_{torch.__version__}".replace(".", "_").replace("+", "_")
    return f"cachalot_torch_allocator_{tag}"


def load(library, verbose=False):
    """The compiled extension, built on first use. ``library`` is the Rust
    library it links."""
    global _module
    if _module is None:
        import torch
        from torch.utils import cpp_extension

        libdir = str(pathlib.Path(library).parent)
        torch_lib = str(pathlib.Path(torch.__file__).resolve().parent / "lib")
        _module = cpp_extension.load(
            name=_name(),
            sources=[str(_SOURCE)],
            extra_include_paths=[_cuda_include()],
            extra_cflags=["-O2"],
            extra_ldflags=[
                f"-L{torch_lib}",
                "-lc10_cuda",
                "-ltorch_cuda",
                f"-L{libdir}",
                f"-l:{pathlib.Path(library).name}",
                f"-Wl,-rpath,{libdir}",
            ],
            with_cuda=False,
            verbose=verbose,
        )
    return _module


def loaded():
    """The extension if this process loaded it, else None."""
    return _module

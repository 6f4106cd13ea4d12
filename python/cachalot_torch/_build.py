"""Compiles the C++ allocator (``csrc/cachalot_allocator.cpp``) into a plain
shared library against one torch: when the wheel is built
(``scripts/prebuild_allocator.py``, against the headers and libraries of
torch's own wheel) and on first use under a torch the wheel has no prebuilt
allocator for. One compiler call, no build system.

The library links torch's and CUDA's runtime libraries by name and every
symbol must resolve against them (``--no-undefined``), so a build against the
wrong torch or C++ ABI fails here rather than when PyTorch loads it."""

import dataclasses
import hashlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess

from . import SetupError

CSRC = pathlib.Path(__file__).resolve().parent / "csrc"
SOURCE = CSRC / "cachalot_allocator.cpp"
OUTPUT = "libcachalot_allocator.so"
RUST_LIBRARY = "libcachalot_torch.so"
# What the allocator includes of CUDA: the runtime's headers and the crt ones
# they include (which CUDA's wheels ship apart from the runtime's).
CUDA_HEADERS = ("cuda_runtime.h", "cuda.h", "crt/host_config.h")
TORCH_LIBRARIES = ("libc10.so", "libc10_cuda.so", "libtorch_cuda.so")


@dataclasses.dataclass(frozen=True)
class Torch:
    """What a build needs of a torch: its version, its CUDA version, its C++
    ABI and the folder holding its ``include/`` and ``lib/``."""

    version: str
    cuda: str
    cxx11_abi: bool
    root: pathlib.Path

    @classmethod
    def imported(cls):
        import torch

        if torch.version.cuda is None:
            raise SetupError(
                f"cachalot_torch: torch {torch.__version__} is built without CUDA (a CPU-only or ROCm "
                "build): install a CUDA build of torch, such as `pip install torch` on Linux x86_64"
            )
        return cls(torch.__version__, torch.version.cuda, bool(torch._C._GLIBCXX_USE_CXX11_ABI),
                   pathlib.Path(torch.__file__).resolve().parent)

    @property
    def cuda_major(self):
        return int(self.cuda.split(".")[0])

    @property
    def key(self):
        """The releases one build serves: torch's major.minor and CUDA's major
        (``torch2.11-cu13``), as binary wheels for PyTorch are tagged. None for
        a pre-release or a build from source (``2.12.0.dev20260301``,
        ``2.11.0a0+git70d99e9``), whose headers may differ from the release's."""
        release = re.fullmatch(r"(\d+)\.(\d+)\.\d+(\+\w+)?", self.version)
        return f"torch{release[1]}.{release[2]}-cu{self.cuda_major}" if release else None


@dataclasses.dataclass(frozen=True)
class Cuda:
    """CUDA's headers and runtime library, from a toolkit or from NVIDIA's wheels."""

    include: tuple
    lib: pathlib.Path
    version: str
    where: str


def _cudart_version(include):
    text = (include / "cuda_runtime_api.h").read_text(errors="replace")
    found = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", text)
    number = int(found.group(1)) if found else 0
    return f"{number // 1000}.{number % 1000 // 10}"


def _complete(includes, libs, major):
    """The Cuda these folders make up, or what they lack."""
    missing = [h for h in CUDA_HEADERS if not any((d / h).exists() for d in includes)]
    if missing:
        return None, f"no {', '.join(missing)}"
    runtime = next(d for d in includes if (d / "cuda_runtime_api.h").exists())
    version = _cudart_version(runtime)
    if version.split(".")[0] != str(major):
        return None, f"CUDA {version}, not {major}"
    lib = next((d for d in libs if (d / f"libcudart.so.{major}").exists()), None)
    if lib is None:
        return None, f"no libcudart.so.{major}"
    return Cuda(tuple(includes), lib, version, ""), None


def _toolkit(where, root):
    libs = [root / "lib64", root / "lib", root / "targets" / "x86_64-linux" / "lib"]
    return where, [root / "include"], libs


def _named_toolkits():
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            yield _toolkit(f"{var}={os.environ[var]}", pathlib.Path(os.environ[var]))


def _system_toolkits():
    nvcc = shutil.which("nvcc")
    if nvcc:
        yield _toolkit(f"the toolkit of {nvcc}", pathlib.Path(nvcc).resolve().parent.parent)
    yield _toolkit("/usr/local/cuda", pathlib.Path("/usr/local/cuda"))


def _nvidia_wheels(major):
    """NVIDIA's CUDA wheels: ``nvidia/cu13/`` from CUDA 13 on, one folder per
    component (``nvidia/cuda_runtime/``, ``nvidia/cuda_nvcc/``) before."""
    spec = importlib.util.find_spec("nvidia")
    for base in map(pathlib.Path, spec.submodule_search_locations if spec else []):
        folders = [base / f"cu{major}"] if major >= 13 else sorted(base.glob("cuda_*"))
        yield (f"NVIDIA's wheels in {base}", [f / "include" for f in folders if (f / "include").is_dir()],
               [f / "lib" for f in folders])


def _wheels_fix(cuda):
    """The pip command that installs CUDA ``cuda``'s headers as wheels."""
    major = int(cuda.split(".")[0])
    if major >= 13:
        return f'pip install "nvidia-cuda-runtime=={cuda}.*" "nvidia-cuda-crt=={cuda}.*"'
    return f'pip install "nvidia-cuda-runtime-cu{major}=={cuda}.*" "nvidia-cuda-nvcc-cu{major}=={cuda}.*"'


def _look(sources, cuda):
    """The first of ``sources`` (where, include folders, library folders)
    that holds CUDA ``cuda``'s headers and runtime; else SetupError saying
    what each lacked."""
    major = int(cuda.split(".")[0])
    looked = []
    for where, includes, libs in sources:
        if not any(d.is_dir() for d in includes):
            looked.append(f"{where}: no headers")
            continue
        found, lack = _complete(includes, libs, major)
        if found:
            return dataclasses.replace(found, where=where)
        looked.append(f"{where}: {lack}")
    raise SetupError(
        f"compiling the C++ allocator needs CUDA {major}'s headers "
        f"({', '.join(CUDA_HEADERS)}) and libcudart.so.{major}, as torch was built with CUDA {cuda}; "
        f"looked at {'; '.join(looked) or 'nothing'}. Install them as wheels: {_wheels_fix(cuda)}; "
        f"or set CUDA_HOME to a CUDA {major} toolkit."
    )


def find_cuda(cuda):
    """CUDA's headers and runtime of the major version of ``cuda`` (torch's
    ``torch.version.cuda``): the toolkit ``CUDA_HOME`` or ``CUDA_PATH`` names,
    else NVIDIA's wheels, else the toolkit of ``nvcc`` on PATH or in
    ``/usr/local/cuda``."""
    major = int(cuda.split(".")[0])
    return _look([*_named_toolkits(), *_nvidia_wheels(major), *_system_toolkits()], cuda)


def cuda_at(root, cuda):
    """CUDA ``cuda``'s headers and runtime in the toolkit-shaped folder ``root``
    (``include/``, ``lib/``)."""
    return _look([_toolkit(str(root), pathlib.Path(root))], cuda)


def find_compiler():
    """``$CXX``, else ``c++`` or ``g++`` on PATH."""
    named = os.environ.get("CXX")
    found = shutil.which(named) if named else shutil.which("c++") or shutil.which("g++")
    if found:
        return found
    if named:
        raise SetupError(f"CXX={named} names no compiler on PATH: set CXX to a C++ compiler, "
                         "or unset it to use c++ or g++")
    raise SetupError(
        "compiling the C++ allocator needs a C++17 compiler (g++ 9 or later), and "
        "neither c++ nor g++ is on PATH: install one (`apt install g++`, `dnf install gcc-c++`, "
        "`conda install -c conda-forge gxx`) or set CXX"
    )


def command(cxx, torch, cuda, library_dir, rpath):
    """The compiler call that builds the allocator (its output named last with
    ``-o``): against ``torch``'s headers and libraries and ``cuda``'s, linking
    the Rust library in ``library_dir``, found at run time through ``rpath``."""
    includes = [arg for d in (torch.root / "include", *cuda.include) for arg in ("-isystem", str(d))]
    return [
        cxx, "-O2", "-std=c++17", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.cxx11_abi)}",
        *includes, str(SOURCE),
        f"-L{torch.root / 'lib'}", *(f"-l:{name}" for name in TORCH_LIBRARIES),
        f"-L{cuda.lib}", f"-l:libcudart.so.{torch.cuda_major}",
        f"-L{library_dir}", f"-l:{RUST_LIBRARY}",
        "-Wl,--no-undefined", "-Wl,--as-needed", f"-Wl,-rpath,{rpath}",
    ]


def fingerprint(*parts):
    """Names a build: the sources and ``parts`` (the torch it is for)."""
    digest = hashlib.sha256("\0".join(parts).encode())
    for source in sorted(p for p in CSRC.iterdir() if p.is_file()):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def compile_to(cmd, output, verbose=False):
    """Runs ``cmd`` into ``output``: into a file of this process's first, moved
    in place once whole, so processes that build at once never see half a library."""
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}")
    full = [*cmd, "-o", str(partial)]
    if verbose:
        print(" ".join(full), flush=True)
    done = subprocess.run(full, capture_output=not verbose, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or "").strip().splitlines()[-20:]
        raise SetupError(
            "cachalot_torch: the C++ allocator did not compile (exit status "
            f"{done.returncode}):\n  {' '.join(full)}\n" + "\n".join(said) +
            "\nCheck that the compiler is g++ 9 or later and that CUDA's headers match torch's CUDA; "
            "`python -m cachalot_torch` shows what was found."
        )
    os.replace(partial, output)
    return output


def compiler_version(cxx):
    """The compiler's first line of ``--version``."""
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else cxx

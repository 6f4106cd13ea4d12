#!/usr/bin/env python3
"""Builds the C++ allocator for one torch release as the wheel carries it.

Fetches with pip torch's wheel (for its headers and libraries, not installed)
and the CUDA runtime and crt headers it was built with (NVIDIA's wheels),
compiles with the call cachalot_torch makes on first use, every symbol resolved
against torch's own libraries, and writes OUT/torch2.11-cu13/ (the library and
build.json). Downloads are kept in DEPS/torch-VERSION/.

Usage: prebuild_allocator.py --torch 2.11.0 --library target/dist --deps target/wheel-deps --out DIR
"""

import argparse
import json
import pathlib
import re
import runpy
import subprocess
import sys
import zipfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from cachalot_torch import _build  # noqa: E402


def pip_download(into, *requirements):
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(into),
                    *requirements], check=True)


def unpack_torch(version, wheels, sdk):
    """torch's headers, the libraries the allocator links and version.py; the
    cuda-toolkit version its requirements pin."""
    pip_download(wheels, "--no-deps", f"torch=={version}")
    wheel = sorted(wheels.glob(f"torch-{version}-*.whl"))[0]
    wanted = {"torch/version.py", *(f"torch/lib/{name}" for name in _build.TORCH_LIBRARIES)}
    with zipfile.ZipFile(wheel) as z:
        z.extractall(sdk, [n for n in z.namelist() if n in wanted or n.startswith("torch/include/")])
        metadata = z.read(f"torch-{version}.dist-info/METADATA").decode()
    wheel.unlink()  # half a gigabyte; pip's cache keeps a copy
    pinned = re.search(r"^Requires-Dist: cuda-toolkit\[[^\]]*\]==([\d.]+)", metadata, re.MULTILINE)
    if pinned is None:
        raise SystemExit(f"prebuild: torch {version}'s wheel pins no cuda-toolkit version: prebuilt "
                         "allocators are for torch with CUDA 13 from PyPI (2.11 on)")
    return pinned.group(1)


def unpack_cuda(toolkit, wheels, sdk):
    pip_download(wheels, f"cuda-toolkit[cudart,crt]=={toolkit}")
    for wheel in sorted(wheels.glob("nvidia_cuda_*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(sdk, [n for n in z.namelist() if n.startswith("nvidia/")])


def fetch(version, deps):
    """DEPS/torch-VERSION/sdk: torch's part of its wheel and CUDA's headers."""
    sdk = deps / f"torch-{version}" / "sdk"
    done = sdk / ".complete"
    if not done.exists():
        wheels = deps / f"torch-{version}" / "wheels"
        unpack_cuda(unpack_torch(version, wheels, sdk), wheels, sdk)
        done.touch()
    return sdk


def torch_in(sdk):
    info = runpy.run_path(str(sdk / "torch" / "version.py"))
    cxx11 = b"__cxx11" in (sdk / "torch" / "lib" / "libc10.so").read_bytes()
    return _build.Torch(info["__version__"], info["cuda"], cxx11, sdk / "torch")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", required=True, help="torch release, such as 2.11.0")
    parser.add_argument("--library", required=True, type=pathlib.Path, help=f"folder holding {_build.RUST_LIBRARY}")
    parser.add_argument("--deps", required=True, type=pathlib.Path, help="where downloads are kept")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="the package's prebuilt/ folder")
    args = parser.parse_args()
    sdk = fetch(args.torch, args.deps.resolve())
    torch = torch_in(sdk)
    cuda = _build.cuda_at(sdk / "nvidia" / f"cu{torch.cuda_major}", torch.cuda)
    cxx = _build.find_compiler()
    cmd = _build.command(cxx, torch, cuda, args.library.resolve(), rpath="$ORIGIN/../..")
    out = args.out / torch.key
    _build.compile_to(cmd, out / _build.OUTPUT)
    record = {"torch": torch.version, "cuda": cuda.version, "compiler": _build.compiler_version(cxx)}
    (out / "build.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"prebuilt {out / _build.OUTPUT}: torch {torch.version}, CUDA {cuda.version}, {record['compiler']}")


if __name__ == "__main__":
    main()

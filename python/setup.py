"""Puts the Rust library into the package, and the C++ allocators prebuilt for
torch releases when given, and tags the wheel for this platform: it carries
native libraries but no CPython extension, so one wheel serves every Python 3.

scripts/build-wheels.sh builds the wheels users install (the libraries built
before, the wheel repaired to a manylinux tag). `pip install ./python` builds
from a checkout: cargo builds the library, and the allocator compiles on first use."""

import os
import pathlib
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
LIB = "libcachalot_torch.so"


def _cargo_build():
    """The library as cargo builds it (profile `CACHALOT_CARGO_PROFILE`, default
    `dist`: fat LTO, as shipped; `release` builds faster)."""
    if not (REPO / "Cargo.toml").exists():
        raise SystemExit(f"cachalot-torch: no {LIB} given (CACHALOT_TORCH_LIB) and no cachalot checkout at "
                         f"{REPO} to build it from: install a cachalot-torch wheel instead")
    cargo = shutil.which("cargo")
    if cargo is None:
        raise SystemExit(
            "cachalot-torch: building from source needs Rust, and cargo is not on PATH: install Rust "
            "(https://rustup.rs, then open a new shell), or install the prebuilt wheel, which needs "
            "neither Rust nor a compiler (scripts/build-wheels.sh builds it on a machine with both)"
        )
    profile = os.environ.get("CACHALOT_CARGO_PROFILE", "dist")
    print(f"cachalot-torch: cargo build --profile {profile} (about a minute; `pip install -v` shows it)", flush=True)
    subprocess.run([cargo, "build", "--profile", profile, "-p", "cachalot-torch"], cwd=REPO, check=True)
    return REPO / "target" / ("debug" if profile == "dev" else profile) / LIB


class BuildWithLibraries(build_py):
    """Copies the Rust library (`CACHALOT_TORCH_LIB`, else built by cargo) and
    the prebuilt allocators (the folder `CACHALOT_TORCH_PREBUILT`, if set) into
    the package."""

    def run(self):
        super().run()
        package = pathlib.Path(self.build_lib) / "cachalot_torch"
        given = os.environ.get("CACHALOT_TORCH_LIB")
        shutil.copyfile(pathlib.Path(given) if given else _cargo_build(), package / LIB)
        if shutil.which("strip"):
            subprocess.run(["strip", "--strip-debug", str(package / LIB)], check=True)
        shutil.rmtree(package / "prebuilt", ignore_errors=True)  # an earlier build's
        prebuilt = os.environ.get("CACHALOT_TORCH_PREBUILT")
        if prebuilt:
            shutil.copytree(prebuilt, package / "prebuilt")


class NativeDistribution(Distribution):
    """Native libraries inside: installed as platform files (platlib)."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Tagged for this platform only: no CPython extension, any Python 3."""

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(distclass=NativeDistribution, cmdclass={"build_py": BuildWithLibraries, "bdist_wheel": PlatformWheel})

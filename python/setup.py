"""Builds the Rust library (cargo, from the checkout this file sits in) into the
package, and tags the wheel for this platform: it carries a native library but
no CPython extension, so one wheel serves every Python 3."""

import os
import pathlib
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools before 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
LIB = "libcachalot_torch.so"


def _built_library():
    """`CACHALOT_TORCH_LIB` if set; else cargo builds it (profile
    `CACHALOT_CARGO_PROFILE`, default `dist`: fat LTO, as shipped)."""
    given = os.environ.get("CACHALOT_TORCH_LIB")
    if given:
        return pathlib.Path(given)
    if not (REPO / "Cargo.toml").exists():
        raise SystemExit(f"cachalot_torch: no {LIB} given and no cachalot checkout at {REPO} to build it from")
    profile = os.environ.get("CACHALOT_CARGO_PROFILE", "dist")
    subprocess.run(["cargo", "build", "--profile", profile, "-p", "cachalot-torch"], cwd=REPO, check=True)
    folder = "debug" if profile == "dev" else profile
    return REPO / "target" / folder / LIB


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib) / "cachalot_torch" / LIB
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_built_library(), target)
        if shutil.which("strip"):
            subprocess.run(["strip", "--strip-debug", str(target)], check=True)


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(cmdclass={"build_py": BuildWithLibrary, "bdist_wheel": PlatformWheel})

"""The wheels as a PyTorch user gets them, built by scripts/build-wheels.sh
(CI names their folder in CACHALOT_WHEELS, and in CACHALOT_WHEEL_DEPS the
script's downloads for torch 2.11: wheels/ with CUDA's header wheels, sdk/
with torch's headers and libraries): installed with pip into a fresh virtual
environment with no compiler, Rust or ninja on PATH, the prebuilt allocator
found, the cachalot command run, and each failure of installing or of
``use()`` one message with its fix.

torch itself is not installed (its CUDA libraries are gigabytes): a stand-in
package named torch, with the version, CUDA version and state a test needs and
torch 2.11's real headers and libraries beside it, plays the part."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

WHEELS = os.environ.get("CACHALOT_WHEELS")
DEPS = os.environ.get("CACHALOT_WHEEL_DEPS")
REPO = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not (WHEELS and DEPS), reason="skipped: CACHALOT_WHEELS and CACHALOT_WHEEL_DEPS are set by CI after "
                                  "scripts/build-wheels.sh")
TOOLS = ("cargo", "rustc", "c++", "g++", "gcc", "cc", "clang++", "ninja")

STAND_IN = '''"""A stand-in for torch: what cachalot_torch reads of it."""
import os

__version__ = {version!r}


class version:
    cuda = {cuda!r}


class cuda:
    @staticmethod
    def is_initialized():
        return {initialized!r}

    @staticmethod
    def is_available():
        return False


class _C:
    _GLIBCXX_USE_CXX11_ABI = True
'''


def _venv(root, *packages):
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index"]
    subprocess.run([*pip, *map(str, packages)], check=True)
    return root


def _wheels():
    return sorted(pathlib.Path(WHEELS).glob("cachalot_*.whl"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh environment holding the two wheels, and nothing else."""
    return _venv(tmp_path_factory.mktemp("venv"), *_wheels())


@pytest.fixture
def compiler(tmp_path):
    """A folder holding the C++ compiler and what it calls, and nothing else
    (no ninja, no Rust)."""
    folder = tmp_path / "compiler"
    folder.mkdir()
    for tool in ("c++", "as", "ld"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"no {tool} on this machine to compile with")
        (folder / tool).symlink_to(found)
    return folder


def stand_in(tmp_path, version="2.11.0+cu130", cuda="13.0", initialized=False):
    """A torch of this version, CUDA and state, with torch 2.11's headers and
    libraries; the folder to put on PYTHONPATH."""
    root = tmp_path / f"torch-{version}"
    package = root / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(STAND_IN.format(version=version, cuda=cuda, initialized=initialized))
    sdk = pathlib.Path(DEPS) / "sdk" / "torch"
    for folder in ("include", "lib"):
        (package / folder).symlink_to(sdk / folder)
    return root


def run(venv, *args, path=(), torch=None, **env):
    """A command of the environment, with only its bin/ and ``path`` on PATH
    and a cache of its own."""
    variables = {"HOME": str(venv / "home"), "XDG_CACHE_HOME": str(venv / "cache"),
                 "PATH": os.pathsep.join(map(str, [venv / "bin", *path])), **env}
    if torch is not None:
        variables["PYTHONPATH"] = str(torch)
    program = [str(venv / "bin" / args[0]), *args[1:]]
    return subprocess.run(program, capture_output=True, text=True, env=variables, cwd=venv, timeout=600)


def use(venv, **kw):
    return run(venv, "python", "-c", "import cachalot_torch; cachalot_torch.use()", **kw)


def last_line(out):
    return out.stderr.strip().splitlines()[-1]


def test_the_wheels_are_manylinux_and_one_serves_every_python():
    names = [w.name for w in _wheels()]
    assert len(names) == 2 and {n.split("-")[0] for n in names} == {"cachalot_torch", "cachalot_cli"}, names
    assert all("-py3-none-manylinux_" in n for n in names), names


def test_the_environment_has_no_compiler_rust_or_ninja(venv):
    path = str(venv / "bin")
    assert [t for t in TOOLS if shutil.which(t, path=path)] == []


def test_the_cachalot_command_runs_from_the_environment(venv, tmp_path):
    out = run(venv, "cachalot", "--version")
    assert out.returncode == 0 and out.stdout.strip() == "cachalot 0.1.0", out
    trace = REPO / "data" / "traces" / "bert_dynamic.native.trace.csv.gz"
    out = run(venv, "cachalot", "replay", str(trace), "--json")
    assert out.returncode == 0 and '"peak_reserved_bytes"' in out.stdout, out.stderr


def test_the_check_names_the_prebuilt_allocator_without_torch(venv):
    out = run(venv, "python", "-m", "cachalot_torch")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torch2.11-cu13: built against torch 2.11.0+cu130, CUDA 13.0 headers" in out.stdout
    assert "not installed: `pip install torch`" in out.stdout


def test_torch_2_11_with_cuda_13_gets_the_prebuilt_allocator(venv, tmp_path):
    out = run(venv, "python", "-m", "cachalot_torch", torch=stand_in(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    line = next(row for row in out.stdout.splitlines() if row.startswith("C++ allocator"))
    assert line.endswith("/cachalot_torch/prebuilt/torch2.11-cu13/libcachalot_allocator.so"), line
    assert pathlib.Path(line.split()[-1]).is_file()
    assert "GPU                   none" in out.stdout


def test_a_build_of_torch_from_source_compiles_its_own(venv, tmp_path):
    """Its headers may differ from the release's."""
    out = run(venv, "python", "-m", "cachalot_torch", torch=stand_in(tmp_path, version="2.11.0a0+git70d99e9"))
    assert out.returncode == 1
    assert "prebuilt for torch2.11-cu13 only, so under torch 2.11.0a0+git70d99e9 it compiles" in out.stdout


def test_use_without_torch_says_to_install_it(venv):
    out = use(venv)
    assert out.returncode == 1
    assert last_line(out).startswith("cachalot_torch.SetupError: cachalot_torch.use() needs PyTorch")
    assert "`pip install torch`" in last_line(out)


def test_use_after_torch_initialized_cuda_says_to_call_it_first(venv, tmp_path):
    out = use(venv, torch=stand_in(tmp_path, initialized=True))
    assert out.returncode == 1
    assert "cachalot_torch.use() must run before PyTorch initializes CUDA" in last_line(out)
    assert "call use() first, right after `import torch`" in last_line(out)


def test_a_torch_without_cuda_is_named(venv, tmp_path):
    out = use(venv, torch=stand_in(tmp_path, version="2.11.0+cpu", cuda=None))
    assert "torch 2.11.0+cpu is built without CUDA" in last_line(out)


def test_another_torch_without_a_compiler_says_to_install_one(venv, tmp_path):
    torch = stand_in(tmp_path, version="2.12.0+cu130")
    out = use(venv, torch=torch)
    assert out.returncode == 1
    assert "carries the allocator prebuilt for torch2.11-cu13 only, so under torch 2.12.0+cu130 it compiles " \
        "on first use: compiling the C++ allocator needs a C++17 compiler" in last_line(out)
    assert "needs a C++17 compiler (g++ 9 or later), and neither c++ nor g++ is on PATH" in last_line(out)
    assert "`apt install g++`" in last_line(out)
    out = run(venv, "python", "-m", "cachalot_torch", torch=torch)
    assert out.returncode == 1 and "CANNOT BE HAD" in out.stdout


def test_another_torch_without_cuda_headers_says_which_wheels_to_install(venv, tmp_path, compiler):
    torch = stand_in(tmp_path, version="2.12.0+cu130")
    out = use(venv, torch=torch, path=[compiler], CUDA_HOME=str(tmp_path / "no-cuda"))
    message = last_line(out)
    assert "compiling the C++ allocator needs CUDA 13's headers" in message
    assert f"CUDA_HOME={tmp_path / 'no-cuda'}: no headers" in message
    assert 'pip install "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"' in message


def test_a_cuda_toolkit_is_found_from_cuda_home(venv, tmp_path, compiler):
    toolkit = pathlib.Path(DEPS) / "sdk" / "nvidia" / "cu13"
    out = run(venv, "python", "-m", "cachalot_torch", torch=stand_in(tmp_path, version="2.12.0+cu130"),
              path=[compiler], CUDA_HOME=str(toolkit))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"CUDA 13.0 from CUDA_HOME={toolkit}" in out.stdout


def test_another_torch_compiles_with_cuda_from_nvidias_wheels_once(tmp_path, compiler):
    """The runtime's wheel alone lacks the crt headers, and the message names
    the wheel that has them; with it, the allocator compiles (no ninja) into
    the cache, with its time shown, and later runs take it from there."""
    wheels = pathlib.Path(DEPS) / "wheels"
    venv = _venv(tmp_path / "venv", *_wheels(), *wheels.glob("nvidia_cuda_runtime-*.whl"))
    torch = stand_in(tmp_path, version="2.12.0+cu130")
    out = use(venv, torch=torch, path=[compiler])
    assert "NVIDIA's wheels in" in last_line(out) and ": no crt/host_config.h" in last_line(out)
    assert '"nvidia-cuda-crt==13.0.*"' in last_line(out)

    run(venv, "python", "-m", "pip", "install", "-q", "--no-index", *map(str, wheels.glob("nvidia_cuda_crt-*.whl")))
    out = run(venv, "python", "-m", "cachalot_torch", torch=torch, path=[compiler])
    assert "compiles on first use (once) with" in out.stdout and "CUDA 13.0 from NVIDIA's wheels" in out.stdout
    out = use(venv, torch=torch, path=[compiler])
    said = out.stderr
    assert "cachalot_torch: compiling the C++ allocator for torch 2.12.0+cu130, once" in said, said
    assert "cachalot_torch: compiled in " in said, said
    # The stand-in loaded none of torch's libraries, which the allocator needs.
    assert "does not load into this process" in last_line(out)
    out = run(venv, "python", "-m", "cachalot_torch", torch=torch)
    assert "C++ allocator         cached: " in out.stdout, out.stdout


def test_building_from_source_without_rust_says_to_install_it_or_use_the_wheel(venv, tmp_path):
    """pip builds ./python from source (fetching setuptools, as for any user)."""
    out = run(venv, "python", "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(REPO / "python"))
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "building from source needs Rust, and cargo is not on PATH: install Rust (https://rustup.rs" in said
    assert "or install the prebuilt wheel" in said

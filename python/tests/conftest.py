"""Installs cachalot before any test touches CUDA, when torch and a GPU are here.
The policy comes from CACHALOT_ALLOC_CONF (the GPU script runs the suite once per
policy)."""

import importlib.util
import pathlib

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def _gpu():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def pytest_configure(config):
    torch = _gpu()
    config.cachalot_gpu = torch is not None
    if torch is not None:
        import cachalot_torch

        cachalot_torch.use()


@pytest.fixture
def torch_gpu(request):
    if not request.config.cachalot_gpu:
        pytest.skip("skipped: no GPU (or no torch): the drop-in allocator needs a CUDA device")
    import torch

    return torch


@pytest.fixture(scope="session")
def script():
    """Loads one of the checkout's scripts/ as a module: `script("diffcheck")`
    (skips where the tests run outside a checkout, as on the GPU machine)."""

    def load(name):
        path = SCRIPTS / f"{name}.py"
        if not path.exists():
            pytest.skip(f"not in a cachalot checkout (scripts/{name}.py)")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load

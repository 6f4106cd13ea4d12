"""Installs cachalot before any test touches CUDA, when torch and a GPU are here.
The policy comes from CACHALOT_ALLOC_CONF (the GPU script runs the suite once per
policy)."""

import pytest


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

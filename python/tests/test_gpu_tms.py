"""torch_memory_saver (the sleep-and-wake library of SGLang, verl and slime)
on top of cachalot: its MemPool-based mode ("torch": the pool's memory comes
from its own allocator) pauses and resumes tagged memory at the same
addresses, with and without a host backup. Skips where torch_memory_saver is
not installed (the GPU script installs 0.0.10 from its wheel)."""

import pytest

import cachalot_torch

MIB = 1 << 20


@pytest.fixture
def saver(torch_gpu):
    tms_module = pytest.importorskip("torch_memory_saver")
    if cachalot_torch.config()["policy"] != "pytorch":
        pytest.skip("MemPool(allocator=...) is served under the pytorch policy only")
    saver = tms_module.torch_memory_saver
    try:
        saver.hook_mode = "torch"
    except AssertionError:
        pass  # configured by an earlier test of this process
    return saver


@pytest.mark.parametrize("backup", [False, True])
def test_pause_and_resume_keep_addresses(torch_gpu, saver, backup):
    torch = torch_gpu
    tag = f"weights_{backup}"
    with saver.region(tag=tag, enable_cpu_backup=backup):
        x = torch.full((256 * MIB,), 7, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    address = x.data_ptr()
    free_before = torch.cuda.mem_get_info()[0]
    saver.pause(tag)
    free_paused = torch.cuda.mem_get_info()[0]
    assert free_paused - free_before >= 200 * MIB, "the pages went back to the driver"
    saver.resume(tag)
    assert x.data_ptr() == address
    if backup:
        assert int(x.sum().item()) == 7 * 256 * MIB, "the bytes came back"
    x.fill_(1)
    assert int(x.sum().item()) == 256 * MIB
    cachalot_torch.validate()

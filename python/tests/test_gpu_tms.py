"""torch_memory_saver (the sleep-and-wake library of SGLang, verl and slime)
on top of cachalot: its MemPool-based mode ("torch": the pool's memory comes
from its own allocator) pauses and resumes tagged memory at the same
addresses. Skips where torch_memory_saver is not installed (the GPU script
installs 0.0.10 from its wheel).

It runs in a process of its own: torch_memory_saver 0.0.10's torch mode ends
the process with exit status 1 ("only support interesting region" from its
free hook as its pool goes at exit), on PyTorch's own allocator too
(scripts/gpu/sleep_bench.py), which would end the suite's process with it.
Its host-backup case fails the same way on PyTorch's allocator during the run:
cachalot_torch.region does backups (test_gpu_sleep.py)."""

import os
import subprocess
import sys

import pytest

import cachalot_torch

PROGRAM = """
import cachalot_torch, torch
cachalot_torch.use()
from torch_memory_saver import torch_memory_saver as saver
saver.hook_mode = "torch"
MIB = 1 << 20
with saver.region(tag="weights"):
    x = torch.full((256 * MIB,), 7, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
address = x.data_ptr()
free_before = torch.cuda.mem_get_info()[0]
saver.pause("weights")
freed = torch.cuda.mem_get_info()[0] - free_before
saver.resume("weights")
x.fill_(1)
cachalot_torch.validate()
print("RESULT", freed, x.data_ptr() == address, int(x.sum().item()), flush=True)
"""


def test_pause_and_resume_keep_addresses(torch_gpu):
    pytest.importorskip("torch_memory_saver")
    policy = cachalot_torch.config()["policy"]
    env = dict(os.environ, CACHALOT_ALLOC_CONF=f"policy:{policy}")
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"exit {done.returncode}: {done.stderr[-2000:]}"
    _, freed, same_address, total = lines[-1].split()
    assert int(freed) >= 200 * (1 << 20), "the pages went back to the driver"
    assert same_address == "True"
    assert int(total) == 256 * (1 << 20)

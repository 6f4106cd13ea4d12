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
cachalot_torch.region does backups (test_gpu_sleep.py).

A CUDA graph whose tensors live in a region replays after a pause and a
resume, natively (PyTorch's allocator, which shows the test is right) and on
cachalot: its inputs in a region, captured outside one ("inputs"), or captured
inside the region too ("capture": the capture's own allocations still go to
the graph's private pool, not the region's, natively and on cachalot alike, as
seen on an H200; the program prints where they went). torch_memory_saver
0.0.10's own `cuda_graph` needs its preload mode; this is its torch mode with
PyTorch's `torch.cuda.graph`. Without a host backup (which fails in torch mode,
above) the inputs are written again after the resume.

Its preload mode (LD_PRELOAD of its library, which defines `cudaMalloc` and
`cudaFree` and maps their memory itself inside a region) with its own
`cuda_graph`, the case of its CUDA-graph example: cachalot sees the preloaded
`cudaMalloc` and takes its segments from it (the `segments:auto` route), so
the region's blocks and the graph's pool are paused with everything else, as
natively."""

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


GRAPH_PROGRAM = """
import sys
import torch
if sys.argv[1] == "cachalot":
    import cachalot_torch
    cachalot_torch.use()
from torch_memory_saver import torch_memory_saver as saver
saver.hook_mode = "torch"
where = sys.argv[2]
MIB = 1 << 20
n = 4 * MIB
with saver.region(tag="graph"):
    x = torch.full((n,), 2.0, device="cuda")
    w = torch.arange(n, dtype=torch.float32, device="cuda") % 1000
s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()

def capture():
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * w + 1  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g, stream=s):
        y = x * w + 1
    return y

if where == "capture":
    with saver.region(tag="graph"):
        y = capture()
else:
    y = capture()
g.replay()
torch.cuda.synchronize()
first = bool(torch.equal(y, 2 * w + 1))
try:
    pools = list(saver._impl._mem_pools.values())
    y_in_region = any(seg["address"] <= y.data_ptr() < seg["address"] + seg["total_size"]
                      for p in pools for seg in p.snapshot())
except Exception as e:
    y_in_region = repr(e)
print("INFO y in the region's pool:", y_in_region, flush=True)
addresses = (x.data_ptr(), w.data_ptr(), y.data_ptr())
torch.cuda.synchronize()
free_before = torch.cuda.mem_get_info()[0]
saver.pause("graph")
freed = torch.cuda.mem_get_info()[0] - free_before
saver.resume("graph")
x.fill_(5.0)
w.copy_(torch.arange(n, dtype=torch.float32, device="cuda") % 1000)
g.replay()
torch.cuda.synchronize()
second = bool(torch.equal(y, 5 * w + 1))
same = (x.data_ptr(), w.data_ptr(), y.data_ptr()) == addresses
if sys.argv[1] == "cachalot":
    cachalot_torch.validate()
print("RESULT", first, second, freed, same, flush=True)
"""


def _environment(who, base):
    """The child's environment: PyTorch's allocator (`native`) or cachalot
    under the policy this suite runs with, and no expandable segments (which
    torch_memory_saver refuses)."""
    env = dict(base)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if who == "native":
        env.pop("CACHALOT_ALLOC_CONF", None)
    else:
        env["CACHALOT_ALLOC_CONF"] = f"policy:{cachalot_torch.config()['policy']}"
    return env


@pytest.mark.parametrize("where", ["inputs", "capture"])
@pytest.mark.parametrize("who", ["native", "cachalot"])
def test_a_graph_replays_after_pause_and_resume(torch_gpu, who, where):
    pytest.importorskip("torch_memory_saver")
    env = _environment(who, os.environ)
    done = subprocess.run([sys.executable, "-c", GRAPH_PROGRAM, who, where],
                          capture_output=True, text=True, env=env, timeout=300)
    print(who, where, "exit", done.returncode, [line for line in done.stdout.splitlines() if line.startswith("INFO")])
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"{who}, {where}: exit {done.returncode}: {done.stderr[-3000:]}"
    _, first, second, freed, same = lines[-1].split()
    assert first == "True", "the graph's first replay"
    assert int(freed) >= 30 * (1 << 20), f"the inputs' pages went back to the driver: {freed}"
    assert same == "True", "the same addresses after the resume"
    assert second == "True", "the graph replayed on the resumed memory"


PRELOAD_PROGRAM = """
import sys
import torch
if sys.argv[1] == "cachalot":
    import cachalot_torch
    cachalot_torch.use()
from torch_memory_saver import torch_memory_saver as saver
MIB = 1 << 20
rows = 64 * MIB // 4  # 64 MiB of float32 per row, 320 MiB in all
with saver.region():
    kv = torch.full((5, rows), 1.0, device="cuda")
static_input = torch.zeros((5,), device="cuda")

def step():
    return (static_input + kv.mean(dim=1)).mean()

s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    step()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with saver.cuda_graph(g):
    out = step()
static_input.fill_(100.0)
g.replay()
first = out.item() == 101.0
torch.cuda.empty_cache()
torch.cuda.synchronize()
free_before = torch.cuda.mem_get_info()[0]
saver.pause()
freed = torch.cuda.mem_get_info()[0] - free_before
other = torch.zeros((freed // 2,), dtype=torch.uint8, device="cuda")
del other
torch.cuda.empty_cache()
saver.resume()
kv.fill_(2.0)
static_input.fill_(200.0)
g.replay()
second = out.item() == 202.0
route = "native"
if sys.argv[1] == "cachalot":
    cachalot_torch.validate()
    route = cachalot_torch.config()["segments"]
print("RESULT", first, second, freed, route, flush=True)
"""


@pytest.mark.parametrize("who", ["native", "cachalot"])
def test_preload_mode_pauses_a_region_and_a_graph(torch_gpu, who):
    pytest.importorskip("torch_memory_saver")
    from torch_memory_saver.hooks.mode_preload import configure_subprocess

    with configure_subprocess():
        env = _environment(who, os.environ)
    done = subprocess.run([sys.executable, "-c", PRELOAD_PROGRAM, who],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert lines, f"{who}: exit {done.returncode}: {done.stderr[-3000:]}"
    _, first, second, freed, route = lines[-1].split()
    assert route in ("native", "runtime"), f"segments from {route}: the preloaded cudaMalloc is not seen"
    assert first == "True", "the graph's first replay"
    assert int(freed) >= 300 * (1 << 20), f"the region's pages went back to the driver: {freed}"
    assert second == "True", "the graph replayed on the resumed memory"

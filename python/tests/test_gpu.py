"""PyTorch programs on cachalot, as on PyTorch's own allocator: one test per row
of the drop-in table (docs/torch-plugin.md). Skips without a GPU."""

import ctypes
import json
import os
import pickle
import subprocess
import sys

import pytest

import cachalot_torch

MIB = 1 << 20


def test_cachalot_serves_cuda(torch_gpu):
    assert cachalot_torch.installed()
    x = torch_gpu.ones(MIB, device="cuda")
    assert torch_gpu.cuda.memory_allocated() >= 4 * MIB
    assert x.sum().item() == MIB


def test_memory_functions_answer(torch_gpu):
    torch = torch_gpu
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    x = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    assert torch.cuda.memory_allocated() == before + 3 * MIB
    assert torch.cuda.max_memory_allocated() >= before + 3 * MIB
    assert torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
    stats = torch.cuda.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "requested_bytes.all.allocated",
                "num_alloc_retries", "num_ooms", "num_device_alloc", "max_split_size", "oversize_allocations.current"):
        assert key in stats, key
    assert stats["allocation.all.current"] >= 1
    assert "Allocated memory" in torch.cuda.memory_summary()
    del x
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    torch.cuda.reset_accumulated_memory_stats()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == 0
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    cachalot_torch.validate()


def test_empty_cache_returns_memory(torch_gpu):
    torch = torch_gpu
    x = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
    del x
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= reserved - 256 * MIB


def test_out_of_memory_is_catchable_and_training_goes_on(torch_gpu):
    torch = torch_gpu
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *args: seen.append(args))
    with pytest.raises(torch.cuda.OutOfMemoryError, match="CUDA out of memory") as caught:
        torch.empty(200 * 2**30, dtype=torch.uint8, device="cuda")
    assert "Tried to allocate" in str(caught.value)
    assert seen, "the out-of-memory observer was not called"
    assert torch.cuda.memory_stats()["num_ooms"] >= 1
    model = torch.nn.Linear(256, 256).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(64, 256, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    assert torch.isfinite(loss).item()
    cachalot_torch.validate()


def test_pytorchs_own_messages_and_the_accelerator_api(torch_gpu):
    torch = torch_gpu
    with pytest.raises(torch.cuda.OutOfMemoryError, match="Tried to allocate more than 1EB memory"):
        torch.empty(1024 * 1024 * 1024 * 8000000000, dtype=torch.int8, device="cuda")
    x = torch.empty(256, device="cuda")
    stats = torch.accelerator.memory_stats()
    assert stats["active_bytes.all.current"] >= 1024, "torch.accelerator asks cachalot"
    assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated()
    del x


def test_settings_changed_at_run_time_take_effect(torch_gpu):
    torch = torch_gpu
    if cachalot_torch.config()["policy"] != "pytorch":
        pytest.skip("roundup_power2_divisions is a rule of the pytorch policy")
    allocated = lambda: torch.cuda.memory_stats()["allocated_bytes.all.current"]  # noqa: E731
    before = allocated()
    try:
        torch.cuda.memory._set_allocator_settings("roundup_power2_divisions:4")
        x = torch.empty(84 * MIB, dtype=torch.uint8, device="cuda")
        assert allocated() - before == 96 * MIB
    finally:
        torch.cuda.memory._set_allocator_settings("")
    y = torch.empty(84 * MIB, dtype=torch.uint8, device="cuda")
    assert allocated() - before == 96 * MIB + 84 * MIB
    del x, y


def test_caching_off_allocates_outside_the_cache(torch_gpu):
    torch = torch_gpu
    stream = torch.cuda.current_stream().cuda_stream
    requested = lambda: torch.cuda.memory_stats()["requested_bytes.all.allocated"]  # noqa: E731
    torch.cuda.caching_allocator_enable(False)
    try:
        before = requested()
        ptr = torch._C._cuda_cudaCachingAllocator_raw_alloc(MIB, stream)
        assert requested() == before
    finally:
        torch.cuda.caching_allocator_enable(True)
    torch._C._cuda_cudaCachingAllocator_raw_delete(ptr)
    cachalot_torch.validate()


def test_a_mempool_with_its_own_allocator(torch_gpu, tmp_path):
    torch = torch_gpu
    if cachalot_torch.config()["policy"] != "pytorch":
        pytest.skip("the cachalot policy's private pools are mapped pages of its own")
    from torch.utils import cpp_extension

    source = """
    #include <cuda_runtime_api.h>
    #include <cstddef>
    extern "C" {
    int calls[2] = {0, 0};
    void* own_alloc(size_t size, int device, void* stream) {
      void* p = nullptr; calls[0]++; cudaMalloc(&p, size); return p;
    }
    void own_free(void* p, size_t size, int device, void* stream) { calls[1]++; cudaFree(p); }
    }
    """
    lib = cpp_extension.load_inline(
        name="cachalot_own_allocator", cpp_sources=[source], is_python_module=False,
        with_cuda=True, build_directory=str(tmp_path))
    allocator = torch.cuda.memory.CUDAPluggableAllocator(lib, "own_alloc", "own_free")
    pool = torch.cuda.MemPool(allocator.allocator())
    with torch.cuda.use_mem_pool(pool):
        x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
        y = torch.empty(MIB // 2, dtype=torch.uint8, device="cuda")
    assert len(pool.snapshot()) == 1, "both in one 2 MiB segment of the pool's allocator"
    calls = (ctypes.c_int * 2).in_dll(ctypes.CDLL(lib), "calls")
    assert calls[0] == 1
    del x, y, pool, allocator
    torch.cuda.empty_cache()
    assert calls[1] == 1, "the segment went back to the pool's allocator"
    cachalot_torch.validate()


def test_two_gpus_in_one_process(torch_gpu):
    torch = torch_gpu
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    n = 16 * MIB
    a = torch.randn(n, device="cuda:0")
    b = torch.randn(n, device="cuda:1")
    c = a.to("cuda:1") + b
    assert torch.equal(c.cpu(), a.cpu() + b.cpu())
    if torch.cuda.can_device_access_peer(1, 0):
        # A kernel of GPU 1 reading GPU 0's memory: needs access to its pages.
        torch.cuda.set_device(1)
        d = torch.empty(n, device="cuda:1")
        d.copy_(a, non_blocking=True)
        torch.cuda.synchronize(1)
        assert torch.equal(d.cpu(), a.cpu())
        torch.cuda.set_device(0)
    for device in (0, 1):
        cachalot_torch.validate(device)


def test_memory_fraction_limits(torch_gpu):
    torch = torch_gpu
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.01)
    try:
        assert torch.cuda.get_per_process_memory_fraction() == 0.01 if hasattr(
            torch.cuda, "get_per_process_memory_fraction") else True
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    torch.empty(4 * 2**30, dtype=torch.uint8, device="cuda")


def test_history_and_snapshots(torch_gpu, tmp_path):
    torch = torch_gpu
    torch.cuda.memory._record_memory_history(max_entries=10000)
    try:
        kept = [torch.empty(k * MIB, dtype=torch.uint8, device="cuda") for k in (1, 2, 3)]
        del kept[0]
        snap = torch.cuda.memory._snapshot()
        path = tmp_path / "snap.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert snap["segments"], "no segments"
    actions = [e["action"] for e in snap["device_traces"][torch.cuda.current_device()]]
    assert "alloc" in actions and "free_requested" in actions, actions[:20]
    allocs = [e for e in snap["device_traces"][torch.cuda.current_device()] if e["action"] == "alloc"]
    assert any(f["filename"].endswith("test_gpu.py") for e in allocs for f in e["frames"]), "no Python frames"
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert blocks and all("frames" in b for b in blocks)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    from torch.cuda import _memory_viz

    assert "<html" in _memory_viz.trace_plot(loaded)
    assert _memory_viz.segment_plot(loaded)
    assert torch.cuda.memory._snapshot()["segments"]


def test_record_stream_on_a_side_stream(torch_gpu):
    torch = torch_gpu
    side = torch.cuda.Stream()
    x = torch.ones(8 * MIB, device="cuda")
    with torch.cuda.stream(side):
        y = x * 2
    y.record_stream(side)
    del y
    side.synchronize()
    assert x.sum().item() == 8 * MIB
    cachalot_torch.validate()


def test_cuda_graph_capture(torch_gpu):
    torch = torch_gpu
    static = torch.randn(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = static * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = static * 2 + 1
    static.copy_(torch.arange(1024, device="cuda", dtype=torch.float32))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.arange(1024, device="cuda", dtype=torch.float32) * 2 + 1)


def test_torch_compile_default(torch_gpu):
    torch = torch_gpu
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    x = torch.randn(16, 64, device="cuda")
    expected = model(x)
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(x), expected)


STATS_PROGRAM = r"""
import json, random, sys
import torch
if sys.argv[1] == "cachalot":
    import cachalot_torch
    cachalot_torch.use(conf=sys.argv[3])
out = []
for seed in map(int, sys.argv[2].split(",")):
    # Each seed starts from an empty cache and reset counters: the resets are
    # compared too.
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    rng = random.Random(seed)
    live = []
    for step in range(400):
        r = rng.random()
        if r < 0.55 or not live:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 << 20), rng.randrange(1, 64 << 20)])
            live.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        elif r < 0.97:
            live.pop(rng.randrange(len(live)))
        else:
            torch.cuda.empty_cache()
        out.append(torch.cuda.memory_stats())
    del live
print(json.dumps(out))
"""


STATS_CONFS = ["", "max_split_size_mb:64", "roundup_power2_divisions:4"]


@pytest.fixture(scope="module")
def stats_runs(request):
    """Every configuration's program on both allocators, one process after
    another, native twice: `{(conf, who): CompletedProcess}`. Not side by
    side: with six processes on the GPU at once, PyTorch's own allocator once
    split a block differently (inactive_split 7 against 6 at seed 2, step
    135, under roundup_power2_divisions:4). Run alone it did so too, once in
    three runs: among free blocks of one size it takes the lowest address,
    and the addresses are the driver's, which need not repeat from one
    process to the next. Its second run tells where it reproduces itself."""
    if not request.config.cachalot_gpu:
        pytest.skip("skipped: no GPU (or no torch): the drop-in allocator needs a CUDA device")
    if cachalot_torch.config()["policy"] != "pytorch":
        pytest.skip("the pytorch policy's statistics are the ones that match native")
    runs = {}
    for conf in STATS_CONFS:
        for who in ("native", "native2", "cachalot"):
            env = dict(os.environ)
            env.pop("CACHALOT_ALLOC_CONF", None)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if who.startswith("native") and conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            cl_conf = f"policy:pytorch,{conf}" if conf else "policy:pytorch"
            args = [sys.executable, "-c", STATS_PROGRAM, who, "0,1,2", cl_conf if who == "cachalot" else conf]
            runs[conf, who] = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, check=False)
    return runs


def _stats_of(run):
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("conf", STATS_CONFS)
def test_pytorch_policy_stats_equal_native(stats_runs, conf):
    """Every figure equal at every step where PyTorch's allocator reproduces
    itself: in each seed, up to the first step where its two runs differ
    (most of the 1,200 steps, or the test fails)."""
    native, again, cachalot = (_stats_of(stats_runs[conf, who]) for who in ("native", "native2", "cachalot"))
    assert len(native) == len(again) == len(cachalot) == 1200
    compared = 0
    for seed in range(3):
        for step in range(seed * 400, (seed + 1) * 400):
            n, c = native[step], cachalot[step]
            if n != again[step]:
                break  # native does not reproduce itself from here in this seed
            diff = {k: (n[k], c.get(k)) for k in n if n[k] != c.get(k)}
            assert not diff, f"seed {seed} step {step % 400}: {diff}"
            compared += 1
    assert compared >= 900, f"native reproduced itself in only {compared} of 1200 steps"

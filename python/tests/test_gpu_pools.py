"""Private pools on the drop-in allocator: CUDA graphs (one pool, a pool shared
by two graphs), torch.cuda.MemPool with each option, and
torch.compile(mode="reduce-overhead") training and inference giving native's
outputs. Skips without a GPU."""

import inspect
import json
import os
import subprocess
import sys

import pytest

import cachalot_torch

MIB = 1 << 20


def _pool_segments(torch, pool_id):
    return [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool_id)]


def _holder(segments, ptr):
    for s in segments:
        if s["address"] <= ptr < s["address"] + s["total_size"]:
            return s
    return None


def test_graph_capture_allocates_in_a_private_pool(torch_gpu):
    torch = torch_gpu
    static = torch.randn(1 << 18, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            out = (static * 2).relu() + 1
    torch.cuda.current_stream().wait_stream(s)
    del out
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = static * 2
        out = tmp.relu() + 1
        del tmp
    pool = g.pool()
    assert pool != (0, 0)
    holder = _holder(torch.cuda.memory_snapshot(), out.data_ptr())
    assert holder is not None and tuple(holder["segment_pool_id"]) == tuple(pool), holder
    for k in range(3):
        static.copy_(torch.full_like(static, float(k) - 1.0))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, (static * 2).relu() + 1)
    cachalot_torch.validate()
    # The graph's memory stays through empty_cache while the graph lives...
    torch.cuda.empty_cache()
    assert _pool_segments(torch, pool)
    # ... and goes back once the graph and its outputs are gone.
    del out, g
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert not _pool_segments(torch, pool)
    cachalot_torch.validate()


def test_two_graphs_share_a_pool(torch_gpu):
    torch = torch_gpu
    pool = torch.cuda.graph_pool_handle()
    x = torch.randn(4096, device="cuda")
    w = torch.randn(4096, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * w
        z = y.sin() + y
    torch.cuda.current_stream().wait_stream(s)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool):
        y = x * w
    with torch.cuda.graph(g2, pool=pool):
        z = y.sin() + y
    assert g1.pool() == g2.pool() == pool
    for k in range(3):
        x.copy_(torch.randn_like(x))
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        expected = x * w
        torch.testing.assert_close(y, expected, rtol=0, atol=0)
        torch.testing.assert_close(z, expected.sin() + expected, rtol=0, atol=0)
    cachalot_torch.validate()
    del g1, g2, y, z
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert not _pool_segments(torch, pool)


def _mempool(torch, **options):
    params = inspect.signature(torch.cuda.MemPool).parameters
    missing = [k for k in options if k not in params]
    if missing:
        pytest.skip(f"this torch's MemPool has no {missing}")
    return torch.cuda.MemPool(**options)


@pytest.mark.parametrize("options", [{}, {"use_on_oom": True}, {"no_split": True}], ids=["plain", "use_on_oom", "no_split"])
def test_mempool(torch_gpu, options):
    torch = torch_gpu
    pool = _mempool(torch, **options)
    assert pool.use_count() == 1
    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2
        a = torch.empty(1000, dtype=torch.uint8, device="cuda")
        b = torch.empty(1000, dtype=torch.uint8, device="cuda")
        big = torch.empty(24 * MIB, dtype=torch.uint8, device="cuda")
    assert pool.use_count() == 1
    outside = torch.empty(1000, dtype=torch.uint8, device="cuda")
    snap = pool.snapshot()
    assert snap, "the pool's snapshot lists its segments"
    assert all(tuple(s["segment_pool_id"]) == tuple(pool.id) for s in snap)
    for t in (a, b, big):
        assert _holder(snap, t.data_ptr()) is not None
    del t
    assert _holder(snap, outside.data_ptr()) is None
    if options.get("no_split"):
        assert abs(a.data_ptr() - b.data_ptr()) >= 2 * MIB, "no_split: each allocation has its own block"
    else:
        assert abs(a.data_ptr() - b.data_ptr()) < 2 * MIB
    if options.get("use_on_oom"):
        del big
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + 4 * MIB) / total)
        try:
            borrowed = torch.empty(16 * MIB, dtype=torch.uint8, device="cuda")
            assert _holder(pool.snapshot(), borrowed.data_ptr()) is not None, "served from the pool"
            del borrowed
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
    cachalot_torch.validate()
    pool_id = pool.id
    del a, b, outside
    big = None
    del pool
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    assert not _pool_segments(torch, pool_id)
    cachalot_torch.validate()


COMPILE_PROGRAM = r"""
import json, sys
import torch
if sys.argv[1] == "cachalot":
    import cachalot_torch
    cachalot_torch.use(conf=sys.argv[2])
torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False

class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(512, 128)
        layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2)
        self.head = torch.nn.Linear(128, 512)
    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))

def cnn():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))

out = {}
for name, make, batch in (
    ("transformer", Transformer, lambda g: torch.randint(0, 512, (8, 64), device="cuda", generator=g)),
    ("cnn", cnn, lambda g: torch.randn(16, 3, 32, 32, device="cuda", generator=g)),
):
    torch.manual_seed(1)
    model = make().cuda()
    g = torch.Generator(device="cuda").manual_seed(2)
    # Inference.
    model.eval()
    infer = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        results = [infer(batch(g)).float().sum().item() for _ in range(5)]
    out[name + "/inference"] = results
    # Training.
    model.train()
    train = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(6):
        x = batch(g)
        y = train(x)
        loss = y.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    out[name + "/training"] = losses
out["max_reserved"] = torch.cuda.max_memory_reserved()
if sys.argv[1] == "cachalot":
    cachalot_torch.validate()
print(json.dumps(out))
"""


def test_reduce_overhead_gives_natives_outputs(torch_gpu, tmp_path):
    conf = os.environ.get("CACHALOT_ALLOC_CONF", "")
    runs = {}
    for who in ("native", "expandable", "cachalot"):
        env = dict(os.environ)
        env.pop("CACHALOT_ALLOC_CONF", None)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if who == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / who)
        runs[who] = subprocess.Popen([sys.executable, "-c", COMPILE_PROGRAM, who, conf],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    got = {}
    for who, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=540)
        assert proc.returncode == 0, f"{who}: {stderr[-3000:]}"
        got[who] = json.loads(stdout.strip().splitlines()[-1])
    native, cachalot = got["native"], got["cachalot"]
    for key in native:
        if key == "max_reserved":
            continue
        assert cachalot[key] == pytest.approx(native[key], rel=1e-5, abs=1e-5), key
    print(f"reduce-overhead max reserved: native {native['max_reserved'] / MIB:.0f} MiB, "
          f"expandable_segments {got['expandable']['max_reserved'] / MIB:.0f} MiB, "
          f"cachalot ({conf or 'policy:pytorch'}) {cachalot['max_reserved'] / MIB:.0f} MiB")

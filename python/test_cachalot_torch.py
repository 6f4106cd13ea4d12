"""GPU checks of the cachalot PyTorch plug-in. Needs a CUDA GPU and the built
library; run as a script (``python3 python/test_cachalot_torch.py``), which
installs cachalot first (the allocator can only be swapped before CUDA is used),
or under pytest, which does the same in ``setup_module``.

What is checked:
* statistics follow PyTorch's meaning for plain allocations and frees;
* a block freed while a side stream still reads it (``record_stream``) is not
  handed out again until that stream has passed the free, so its data survive;
* blocks freed on one stream are not reused by another;
* ``empty_cache`` through torch's own function returns cached memory;
* every invariant holds afterwards, and a snapshot pickle loads.
"""

import os
import pickle
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cachalot_torch  # noqa: E402

MIB = 1 << 20


def setup_module(_module=None):
    cachalot_torch.use()


def test_stats_follow_allocations():
    import torch

    base = cachalot_torch.memory_allocated()
    x = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    assert cachalot_torch.memory_allocated() == base + MIB
    stats = cachalot_torch.memory_stats()
    assert stats["allocation.all.current"] >= 1
    assert stats["reserved_bytes.all.current"] >= base + MIB
    assert stats["allocated_bytes.small_pool.current"] >= MIB  # 1 MiB is small
    del x
    assert cachalot_torch.memory_allocated() == base
    cachalot_torch.validate()


def test_record_stream_defers_reuse():
    """A side stream reads ``a`` after a long sleep; ``a`` is freed at once on the
    host, then a same-sized tensor is written on the default stream. Reusing ``a``'s
    block before the side stream is done would corrupt what it reads."""
    import torch

    n = 4 * MIB
    side = torch.cuda.Stream()
    # Load every kernel first: a kernel's first launch can synchronize the device
    # (lazy module loading), which would let the side stream finish early.
    warm = torch.full((n,), 1.0, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        warm = warm * 2
    torch.cuda.synchronize()
    del warm

    a = torch.full((n,), 3.0, device="cuda")
    a_ptr = a.data_ptr()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time
        out = a * 2
    a.record_stream(side)
    del a
    stats = cachalot_torch.memory_stats()
    pending = stats["active.all.current"] - stats["allocation.all.current"]
    b = torch.empty(n, device="cuda")
    side_busy = not side.query()
    b.fill_(-1.0)
    assert side_busy, "inconclusive: the side stream finished before the reallocation"
    assert pending >= 1, f"the free did not wait for the side stream (hooks: {cachalot_torch.hooks()})"
    assert b.data_ptr() != a_ptr, "block reused while a side stream still used it"
    side.synchronize()
    torch.cuda.synchronize()
    assert torch.all(out == 6.0).item(), "side stream read overwritten memory"
    stats = cachalot_torch.memory_stats()
    assert stats["active.all.current"] >= 2
    del b, out
    cachalot_torch.validate()


def test_blocks_stay_with_their_stream():
    import torch

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda")
    x_ptr = x.data_ptr()
    del x  # cached for `side`
    torch.cuda.synchronize()
    y = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda")  # default stream
    # PyTorch's rule, which the pytorch policy keeps exactly: a block freed on one
    # stream never serves another. (The cachalot policy may hand it over once the
    # stream has passed the free, so only its own stream's reuse is checked there.)
    if cachalot_torch.config()["policy"] == "pytorch":
        assert y.data_ptr() != x_ptr, "a block cached for a side stream served the default stream"
        with torch.cuda.stream(side):
            z = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda")
        assert z.data_ptr() == x_ptr, "the side stream's cached block was not reused on that stream"
        del z
    del y
    cachalot_torch.validate()


def test_empty_cache_through_torch():
    import torch

    x = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    del x
    assert cachalot_torch.memory_reserved() >= 64 * MIB
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # reaches cachalot through the reset hook
    assert cachalot_torch.memory_reserved() < 64 * MIB
    cachalot_torch.reset_peak_memory_stats()
    assert cachalot_torch.max_memory_reserved() == cachalot_torch.memory_reserved()
    cachalot_torch.validate()


def test_snapshot_and_summary():
    import torch

    cachalot_torch.record_memory_history(True)
    x = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
    summary = cachalot_torch.memory_summary()
    assert "Allocated memory" in summary, summary
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "snapshot.pickle")
        cachalot_torch.dump_snapshot(path)
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
    assert "segments" in snapshot and "device_traces" in snapshot, snapshot.keys()
    assert any(s["total_size"] >= 3 * MIB for s in snapshot["segments"])
    cachalot_torch.record_memory_history(False)
    del x


_OOM_PROBE = """
import sys, torch
sys.path.insert(0, %r)
import cachalot_torch
cachalot_torch.use(conf="per_process_memory_fraction:0.01")
small = torch.ones(1024, device="cuda")
try:
    big = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    print("no exception; data_ptr", hex(big.data_ptr()), "| last error:", cachalot_torch.last_error())
except Exception as e:
    print("raised", type(e).__name__, str(e).splitlines()[0][:200], "| last error:", cachalot_torch.last_error())
print("num_ooms", cachalot_torch.memory_stats()["num_ooms"], "| small still usable:", small.sum().item())
"""


def probe_oom():
    """What PyTorch does when cachalot's allocation fails (it does not check the
    callback's NULL): run in a child process, reported, not asserted."""
    import subprocess

    code = _OOM_PROBE % os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    print("oom probe:", (proc.stdout + proc.stderr[-600:]).strip().replace("\n", " || "))


def main():
    setup_module()
    tests = [(name, fn) for name, fn in sorted(globals().items()) if name.startswith("test_") and callable(fn)]
    failed = 0
    for name, fn in tests:
        try:
            fn()
            print(f"ok    {name}")
        except Exception as e:  # report every test, then fail
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - failed} passed, {failed} failed; config {cachalot_torch.config()}")
    if "--oom-probe" in sys.argv:
        probe_oom()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

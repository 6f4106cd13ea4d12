"""Device-wide peaks with several streams and threads, through the drop-in
allocator: PyTorch's peaks are the highest values the device's statistics
reached, not the sum of each stream's highest; and many distinct streams at
once. Skips without a GPU."""

import random
import threading

import cachalot_torch
import pytest

MIB = 1 << 20


def _fresh_peaks(torch):
    """The statistics with every peak reset to its current value."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_stats()


def _run(workers):
    """Runs each callable on a thread of its own; re-raises the first error."""
    errors = []

    def guarded(work):
        try:
            work()
        except BaseException as e:  # noqa: BLE001 (handed to the test's thread)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]


def test_a_peak_over_two_streams_is_the_devices_not_their_sum(torch_gpu):
    torch = torch_gpu
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    base = _fresh_peaks(torch)
    with torch.cuda.stream(first):
        x = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    del x
    with torch.cuda.stream(second):
        y = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    stats = torch.cuda.memory_stats()
    for family in ("allocated_bytes", "requested_bytes", "active_bytes"):
        assert stats[f"{family}.all.peak"] == base[f"{family}.all.current"] + 100 * MIB, family
    assert stats["allocation.all.peak"] == base["allocation.all.current"] + 1
    assert torch.cuda.max_memory_allocated() == stats["allocated_bytes.all.peak"]
    del y
    cachalot_torch.validate()


def test_peaks_follow_threads_that_hand_tensors_over_between_streams(torch_gpu):
    """Two threads, each on a stream of its own, take turns: each allocates,
    then frees the tensor the other allocated in the turn before. The true
    peak is the largest pair of neighbouring sizes; adding each stream's own
    peaks would count two turns that were never live together."""
    torch = torch_gpu
    sizes = [(1 + (7 * i) % 23) * MIB + 512 * (i % 3) for i in range(60)]
    turns = [threading.Event() for _ in range(len(sizes) + 1)]
    handed = []
    base = _fresh_peaks(torch)["requested_bytes.all.current"]

    def worker(parity):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            for i in range(parity, len(sizes), 2):
                assert turns[i].wait(timeout=60), f"turn {i} never came"
                mine = torch.empty(sizes[i], dtype=torch.uint8, device="cuda")
                if handed:
                    handed.pop()  # the other thread's tensor, freed here
                handed.append(mine)
                del mine
                turns[i + 1].set()

    turns[0].set()
    _run([lambda: worker(0), lambda: worker(1)])
    handed.clear()
    stats = torch.cuda.memory_stats()
    pairs = max(a + b for a, b in zip(sizes, sizes[1:]))
    assert stats["requested_bytes.all.peak"] == base + pairs
    assert stats["requested_bytes.all.current"] == base
    cachalot_torch.validate()


def _check_marks(held):
    """Every tensor of `held` (thread: tensors) holds its thread's mark (in a
    function of its own: no loop variable outlives it holding a tensor)."""
    for t, live in held.items():
        for x in live:
            assert bool((x == t + 1).all()), f"thread {t}'s tensor of {x.numel()} bytes lost its mark"


def test_threads_allocating_at_once_keep_their_data(torch_gpu):
    """Four threads allocate and free at the same time, each on its own
    stream, filling each tensor with its own mark. Every tensor keeps its
    mark, everything is given back, the invariants hold, and the peak lies
    between the largest one thread held and what all held together."""
    torch = torch_gpu
    threads, steps = 4, 400
    held = {}
    most = [0] * threads
    base = _fresh_peaks(torch)["requested_bytes.all.current"]

    def worker(t):
        rng = random.Random(t)
        stream = torch.cuda.Stream()
        live, now = [], 0
        with torch.cuda.stream(stream):
            for _ in range(steps):
                if live and (len(live) >= 12 or rng.random() < 0.4):
                    now -= live.pop(rng.randrange(len(live))).numel()
                    continue
                n = rng.choice([1 << 10, 3 << 12, 1 << 20, 5 << 20, 9 << 20]) + rng.randrange(512)
                live.append(torch.full((n,), t + 1, dtype=torch.uint8, device="cuda"))
                now += n
                most[t] = max(most[t], now)
            stream.synchronize()
        held[t] = live

    _run([lambda t=t: worker(t) for t in range(threads)])
    peak = torch.cuda.memory_stats()["requested_bytes.all.peak"] - base
    assert max(most) <= peak <= sum(most), (peak, most)
    torch.cuda.synchronize()
    _check_marks(held)
    held.clear()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["requested_bytes.all.current"] == base
    cachalot_torch.validate()


def test_a_thousand_distinct_streams_each_keep_a_small_and_a_large_tensor(torch_gpu):
    """Distinct CUDA streams (torch.cuda.Stream() hands out a pool of 32), made
    by CuPy: each keeps a 4 KiB and a 4 MiB tensor. Under the cachalot policy
    each stream's two ranges (six times an H200's memory) would have taken
    the 128 TiB of address space the driver grants by the 156th stream; the
    allocator keeps its ranges within half of that and halves what would
    pass it. Skips without CuPy."""
    torch = torch_gpu
    cupy = pytest.importorskip("cupy", reason="skipped: no CuPy to make raw CUDA streams")
    raw, keep = [], []
    for _ in range(1000):
        made = cupy.cuda.Stream(non_blocking=True)
        raw.append(made)
        with torch.cuda.stream(torch.cuda.ExternalStream(made.ptr)):
            keep.append(torch.empty(1024, device="cuda"))
            keep.append(torch.empty(MIB, device="cuda"))
    torch.cuda.synchronize()
    assert len({s.ptr for s in raw}) == 1000
    cachalot_torch.validate()
    del keep
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    cachalot_torch.validate()

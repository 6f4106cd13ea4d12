"""scripts/diffcheck.py's programs and comparison, without a GPU or torch."""

import pytest


@pytest.fixture(scope="module")
def dc(script):
    return script("diffcheck")


def test_a_seed_gives_one_valid_program(dc):
    for seed in range(200):
        ops = dc.program(seed, 150)
        assert ops == dc.program(seed, 150)
        live, pools, routed = 0, 0, False
        for op in ops:
            if op[0] == "pool_new":
                assert not routed and pools < dc.MAX_POOLS
                pools += 1
            elif op[0] == "pool_enter":
                assert not routed and 0 <= op[1] < pools
                routed = True
            elif op[0] == "pool_exit":
                assert routed
                routed = False
            elif op[0] == "pool_del":
                assert not routed and 0 <= op[1] < pools
                pools -= 1
            elif op[0] == "alloc":
                assert 1 <= op[1] < 400 * dc.MIB and 0 <= op[2] < dc.STREAMS
                live += 1
            elif op[0] == "free":
                assert 0 <= op[1] < live
                live -= 1
            elif op[0] == "record":
                assert 0 <= op[1] < live and 0 <= op[2] < dc.STREAMS
    kinds = {op[0] for seed in range(50) for op in dc.program(seed, 150)}
    assert kinds == {"alloc", "free", "record", "empty_cache", "reset_peak",
                     "pool_new", "pool_enter", "pool_exit", "pool_del"}
    assert dc.program(1, 150) != dc.program(2, 150)


def test_differences_are_found_and_named(dc):
    native = {1: ["a", "b", "c"], 2: ["a", "b"]}
    assert dc.compare(native, {1: ["a", "b", "c"], 2: ["a", "b"]}) == (2, [])
    assert dc.compare(native, {1: ["a", "x", "c"], 2: ["a", "b"]}) == (2, [1])
    assert dc.compare(native, {1: ["a", "b", "c"]}) == (2, [2])
    a = [{"k": 1, "j": 2}, {"k": 1, "j": 3}]
    assert dc.first_difference(a, [{"k": 1, "j": 2}, {"k": 2, "j": 3}]) == (1, ["k"])
    assert dc.first_difference(a, a) is None
    assert dc.first_difference(a, a[:1]) == (1, [])


def test_each_allocator_gets_its_configuration(dc):
    env = dc._env("cachalot", "roundup_power2_divisions:4")
    assert env["CACHALOT_ALLOC_CONF"] == "policy:pytorch,roundup_power2_divisions:4"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env
    assert dc._env("native", "expandable_segments:True")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in dc._env("native", "")


class _FakeTorch:
    """Just what run_program calls, counting what the checker relies on."""

    def __init__(self):
        self.syncs, self.reads, self.allocs = 0, 0, []
        self.pool_count, self.routes, self.released = 0, [], []
        fake = self

        class _Tensor:
            def record_stream(self, stream):
                pass

        class _Stream:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class _Cuda:
            def stream(self, s):
                return _Stream()

            def synchronize(self):
                fake.syncs += 1

            def current_device(self):
                return 0

            def empty_cache(self):
                pass

            def reset_peak_memory_stats(self):
                pass

            def reset_accumulated_memory_stats(self):
                pass

            def memory_stats(self):
                fake.reads += 1
                return {"allocation.all.current": len(fake.allocs)}

            class MemPool:
                def __init__(self):
                    fake.pool_count += 1
                    self.id = (0, fake.pool_count)

        class _C:
            @staticmethod
            def _cuda_memoryStats(device):
                fake.reads += 1
                return {"allocation": {"all": {"current": len(fake.allocs)}}}

            @staticmethod
            def _cuda_beginAllocateCurrentThreadToPool(device, pool_id):
                fake.routes.append(pool_id)

            @staticmethod
            def _cuda_endAllocateToPool(device, pool_id):
                assert fake.routes.pop() == pool_id

            @staticmethod
            def _cuda_releasePool(device, pool_id):
                fake.released.append(pool_id)

        self.cuda, self._C, self.uint8 = _Cuda(), _C, "uint8"
        self._tensor = _Tensor

    def empty(self, size, dtype, device):
        self.allocs.append(size)
        return self._tensor()


def test_a_program_syncs_only_after_freeing_a_tensor_used_on_another_stream(dc):
    torch = _FakeTorch()
    ops = [("alloc", 10, 0), ("alloc", 20, 1), ("record", 0, 2), ("free", 1), ("free", 0), ("empty_cache",)]
    trail = dc.run_program(torch, [None] * dc.STREAMS, ops, False)
    assert len(trail) == len(ops) and torch.reads == len(ops)
    assert torch.syncs == 1 + 1  # the recorded tensor's free, then the program's end
    full = dc.run_program(_FakeTorch(), [None] * dc.STREAMS, ops, True)
    assert full[0] == {"allocation.all.current": 1}


def test_a_route_left_open_is_closed_at_the_program_end(dc):
    torch = _FakeTorch()
    ops = [("pool_new",), ("pool_enter", 0), ("alloc", 10, 0), ("pool_exit",), ("pool_new",),
           ("pool_enter", 1), ("alloc", 20, 1)]
    trail = dc.run_program(torch, [None] * dc.STREAMS, ops, False)
    assert len(trail) == len(ops)
    assert torch.routes == [] and torch.released == [(0, 1), (0, 2)]

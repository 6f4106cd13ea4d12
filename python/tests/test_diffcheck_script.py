"""scripts/diffcheck.py's programs and comparison, without a GPU or torch."""

import pytest


@pytest.fixture(scope="module")
def dc(script):
    return script("diffcheck")


def _check_program(dc, ops, single_record=False):
    """Replays the rules a program must keep; returns the kinds it used."""
    recorded, captured, pools, graphs, route, serial = [], [], 0, [], None, 0
    for op in ops:
        kind = op[0]
        capturing = isinstance(route, tuple)
        if kind in ("pool_new", "pool_del", "pool_enter", "capture_begin", "graph_del", "empty_cache", "record"):
            assert route is None or (kind in ("empty_cache", "record") and route == "pool"), (op, route)
        if kind == "pool_new":
            assert pools < dc.MAX_POOLS
            pools += 1
        elif kind == "pool_enter":
            assert 0 <= op[1] < pools
            route = "pool"
        elif kind == "pool_exit":
            assert route == "pool"
            route = None
        elif kind == "pool_del":
            assert 0 <= op[1] < pools
            pools -= 1
        elif kind == "capture_begin":
            assert len(graphs) < dc.MAX_GRAPHS and 1 <= op[1] < dc.STREAMS
            serial += 1
            graphs.append(serial)
            route = ("capture", op[1])
        elif kind == "capture_end":
            assert capturing
            route = None
        elif kind == "graph_del":
            assert 0 <= op[1] < len(graphs)
            assert graphs[op[1]] not in captured, "a graph outlives the tensors captured into it"
            graphs.pop(op[1])
        elif kind == "alloc":
            assert 1 <= op[1] < 400 * dc.MIB and 0 <= op[2] < dc.STREAMS
            recorded.append(False)
            captured.append(graphs[-1] if capturing and route[1] == op[2] else None)
        elif kind == "free":
            assert 0 <= op[1] < len(recorded)
            assert not (route is not None and recorded[op[1]]), "no free is deferred by a route"
            recorded.pop(op[1])
            captured.pop(op[1])
        elif kind == "record":
            assert 0 <= op[1] < len(recorded) and 0 <= op[2] < dc.STREAMS
            assert not (single_record and recorded[op[1]])
            recorded[op[1]] = True
    return {op[0] for op in ops}


def test_a_seed_gives_one_valid_program(dc):
    kinds = set()
    for seed in range(200):
        ops = dc.program(seed, 150)
        assert ops == dc.program(seed, 150)
        kinds |= _check_program(dc, ops)
        _check_program(dc, dc.program(seed, 150, single_record=True), single_record=True)
    assert kinds == {"alloc", "free", "record", "empty_cache", "reset_peak", "pool_new", "pool_enter",
                     "pool_exit", "pool_del", "capture_begin", "capture_end", "graph_del"}
    assert dc.program(1, 150) != dc.program(2, 150)


def test_differences_are_found_and_named(dc):
    native = {1: ["a", "b", "c"], 2: ["a", "b"]}
    assert dc.compare(native, {1: ["a", "b", "c"], 2: ["a", "b"]}) == (2, [])
    assert dc.compare(native, {1: ["a", "x", "c"], 2: ["a", "b"]}) == (2, [1])
    assert dc.compare(native, {1: ["a", "b", "c"]}) == (2, [2])
    # Under a time budget, only the programs both processes ran count.
    assert dc.compare(native, {1: ["a", "b", "c"]}, budgeted=True) == (1, [])
    assert dc.compare(native, {1: ["a", "x", "c"], 3: ["a"]}, budgeted=True) == (1, [1])
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
        self.pool_count, self.routes, self.released, self.captures = 0, [], [], []
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
                def __init__(self, use_on_oom=False, no_split=False):
                    fake.pool_count += 1
                    self.id = (0, fake.pool_count)

            @staticmethod
            def graph_pool_handle():
                fake.pool_count += 1
                return (0, fake.pool_count)

            class CUDAGraph:
                def capture_begin(self, pool=None, capture_error_mode="global"):
                    assert capture_error_mode == "relaxed"
                    assert pool is not None
                    self.id = pool
                    fake.captures.append(self.id)

                def capture_end(self):
                    assert fake.captures.pop() == self.id


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
    ops = [("pool_new", False, True), ("pool_enter", 0), ("alloc", 10, 0), ("pool_exit",),
           ("pool_new", True, False), ("pool_enter", 1), ("alloc", 20, 1)]
    trail = dc.run_program(torch, [None] * dc.STREAMS, ops, False)
    assert len(trail) == len(ops)
    assert torch.routes == [] and torch.released == [(0, 1), (0, 2)]
    torch = _FakeTorch()
    dc.run_program(torch, [None] * dc.STREAMS, [("capture_begin", 1, True), ("alloc", 10, 1)], False)
    assert torch.captures == []


def test_golden_operations_name_tensors_and_real_pool_ids(dc):
    ops = [("alloc", 10, 0), ("pool_new", True, False), ("capture_begin", 2, False), ("alloc", 30, 2),
           ("free", 0), ("capture_end",), ("record", 0, 1), ("capture_begin", 1, True), ("capture_end",),
           ("graph_del", 0), ("pool_enter", 0), ("pool_exit",), ("pool_del", 0), ("free", 0)]
    golden = []
    dc.run_program(_FakeTorch(), [None] * dc.STREAMS, ops, False, golden)
    assert golden == [
        ["alloc", 0, 10, 0], ["pool_new", 0, 1, 1, 0], ["capture_begin", 0, 2, 2], ["alloc", 1, 30, 2],
        ["free", 0], ["capture_end", 0, 2], ["record", 1, 1], ["capture_begin", 0, 3, 1],
        ["capture_end", 0, 3], ["graph_del", 0, 2], ["pool_enter", 0, 1], ["pool_exit", 0, 1],
        ["pool_del", 0, 1], ["free", 1],
    ]

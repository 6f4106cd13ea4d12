"""scripts/diffcheck.py's programs and comparison, without a GPU or torch."""

import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "diffcheck.py"


@pytest.fixture(scope="module")
def dc():
    if not SCRIPT.exists():
        pytest.skip("not in a cachalot checkout (scripts/diffcheck.py)")
    spec = importlib.util.spec_from_file_location("diffcheck", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_seed_gives_one_valid_program(dc):
    for seed in range(200):
        ops = dc.program(seed, 150)
        assert ops == dc.program(seed, 150)
        live = 0
        for op in ops:
            if op[0] == "alloc":
                assert 1 <= op[1] < 400 * dc.MIB and 0 <= op[2] < dc.STREAMS
                live += 1
            elif op[0] == "free":
                assert 0 <= op[1] < live
                live -= 1
            elif op[0] == "record":
                assert 0 <= op[1] < live and 0 <= op[2] < dc.STREAMS
    kinds = {op[0] for seed in range(50) for op in dc.program(seed, 150)}
    assert kinds == {"alloc", "free", "record", "empty_cache", "reset_peak"}
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

"""scripts/torch_dist.py's comparison, on made-up rank results (no GPU, no torch):
a target missed must show as missed."""

import copy

import pytest


@pytest.fixture(scope="module")
def dist(script):
    return script("torch_dist")


def _rank(step_ms=10.0, reserved=1000, stats_value=7, digest="aa"):
    return {
        "losses": [2.5, 2.25],
        "step_ms_median": step_ms,
        "first_step_ms": 5 * step_ms,
        "step_stats": [{"reserved_bytes.all.current": stats_value}, {"reserved_bytes.all.current": stats_value}],
        "peak_reserved": reserved,
        "peak_allocated": reserved // 2,
        "device_peak_delta": reserved,
        "segment_streams": 2,
        "params_local": digest,
        "params_whole": digest,
        "ranks_agree": True,
    }


def _launch(**kw):
    return {r: {"workloads": {"w": _rank(**kw)}} for r in (0, 1)}


def _rounds(overrides):
    configs = {
        "native": _launch(reserved=1000),
        "expandable": _launch(reserved=900),
        "cl-pytorch": _launch(reserved=1000),
        "cl-cachalot": _launch(reserved=800),
    }
    configs.update(overrides)
    return [copy.deepcopy(configs), copy.deepcopy(configs)]


def _verdicts(dist, rounds):
    rows = dist._compare(rounds, list(dist.CONFIGS), ["w"])
    return rows, dist._verdicts(rows)


def test_every_target_met(dist):
    rows, verdicts = _verdicts(dist, _rounds({}))
    assert all(not v for v in verdicts.values()), verdicts
    text = dist._markdown({"date": "d", "gpu": "g", "gpu_memory": 1 << 30, "nproc": 2, "driver": "x",
                           "torch": "t", "cuda": "c", "python": "p"}, rows, verdicts, "cmd")
    assert text.count("| met |") == 3


@pytest.mark.parametrize(
    "config, change, missed",
    [
        ("cl-pytorch", {"stats_value": 8}, "memory_stats differ"),
        ("cl-cachalot", {"reserved": 950}, "not below expandable"),
        ("cl-cachalot", {"step_ms": 10.5}, "step time"),
        ("cl-pytorch", {"digest": "bb"}, "parameters differ"),
    ],
)
def test_a_missed_target_shows(dist, config, change, missed):
    base = {"reserved": 1000 if config == "cl-pytorch" else 800}
    _, verdicts = _verdicts(dist, _rounds({config: _launch(**{**base, **change})}))
    assert any(missed in m for m in verdicts[("w", config)]), verdicts


def test_a_different_loss_or_a_failed_launch_shows(dist):
    rounds = _rounds({})
    rounds[1]["cl-cachalot"][1]["workloads"]["w"]["losses"][1] = 2.0
    _, verdicts = _verdicts(dist, rounds)
    assert "losses differ from native" in verdicts[("w", "cl-cachalot")]
    rounds[0]["expandable"] = {"_error": "exit 1: NCCL error"}
    rows, verdicts = _verdicts(dist, rounds)
    assert any(r.get("error", "").startswith("exit 1") for r in rows if r["config"] == "expandable")
    assert any("no expandable_segments run" in m for m in verdicts[("w", "cl-cachalot")])


def test_statistics_are_held_to_native_only_where_native_reproduces(dist):
    rounds = _rounds({})
    key = "reserved_bytes.all.current"
    for r in (0, 1):  # PyTorch differs from itself after the first step
        rounds[1]["native"][r]["workloads"]["w"]["step_stats"][0][key] = 9
        rounds[0]["cl-pytorch"][r]["workloads"]["w"]["step_stats"][0][key] = 5
    rows, verdicts = _verdicts(dist, rounds)
    row = next(r for r in rows if r["config"] == "cl-pytorch")
    assert row["stats_reproducible_equal"] == [2, 2]
    assert verdicts[("w", "cl-pytorch")] == []
    rounds[1]["cl-pytorch"][0]["workloads"]["w"]["step_stats"][1][key] = 5
    _, verdicts = _verdicts(dist, rounds)
    assert any("memory_stats differ" in m for m in verdicts[("w", "cl-pytorch")])


def test_an_allocator_with_settings(dist):
    env = dist._config_env("cl-cachalot+cachalot_reuse_slack:0.25")
    assert env == {"CACHALOT_ALLOC_CONF": "policy:cachalot,cachalot_reuse_slack:0.25"}
    for bad in ("native+cachalot_reuse_slack:0.25", "cl-pytorch+x:1", "jemalloc"):
        with pytest.raises(SystemExit):
            dist._config_env(bad)

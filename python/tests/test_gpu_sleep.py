"""Sleep and wake of tagged memory (cachalot_torch.region, pause, resume) on a
GPU: pages back to the driver, the same addresses after a resume, the bytes
restored from a host backup, a captured graph replaying after a resume, and
every bad call a CachalotError that says what to do. Served under the pytorch
policy; under the cachalot policy a region says which setting enables it."""

import pytest

import cachalot_torch
from cachalot_torch import sleep

MIB = 1 << 20


@pytest.fixture
def pytorch_policy(torch_gpu):
    if cachalot_torch.config()["policy"] != "pytorch":
        pytest.skip("tags are served under the pytorch policy (the cachalot policy test checks its refusal)")
    return torch_gpu


def _free(torch):
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def test_pause_gives_pages_back_and_resume_restores_a_host_backup(pytorch_policy):
    torch = pytorch_policy
    free_start = _free(torch)
    with sleep.region("t_weights", backup="host"):
        w = torch.arange(64 * MIB, dtype=torch.int32, device="cuda")
    with sleep.region("t_kv"):
        kv = torch.ones(128 * MIB, dtype=torch.uint8, device="cuda")
    addresses = (w.data_ptr(), kv.data_ptr())
    expected = int(w.sum(dtype=torch.int64).item())
    done = sleep.pause("t_weights")
    assert done["pools"] == 1 and done["copied"] >= 256 * MIB, done
    done = sleep.pause("t_kv")
    assert done["copied"] == 0, "no backup asked"
    free_paused = _free(torch)
    assert free_paused >= free_start - free_start // 100, (
        f"free memory back within 1% of before the tags: {free_paused} vs {free_start}"
    )
    states = {s["tag"]: s for s in sleep.tags()}
    assert states["t_weights"]["paused"] and states["t_weights"]["host_bytes"] >= 256 * MIB
    assert torch.cuda.memory_stats()["reserved_bytes.all.current"] < 256 * MIB
    sleep.resume()
    assert (w.data_ptr(), kv.data_ptr()) == addresses
    assert int(w.sum(dtype=torch.int64).item()) == expected, "the backup came back"
    kv.fill_(3)
    assert int(kv.sum().item()) == 3 * 128 * MIB
    cachalot_torch.validate()
    del w, kv


def test_a_graph_captured_in_a_tag_replays_after_a_resume(pytorch_policy):
    torch = pytorch_policy
    with sleep.region("t_graph_in", backup="host"):
        x = torch.full((4 * MIB,), 2.0, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = x * 3  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with sleep.cuda_graph(g, tag="t_graph"):
        y = x * 3 + 1
    g.replay()
    torch.cuda.synchronize()
    assert float(y[0].item()) == 7.0
    sleep.pause("t_graph")
    sleep.pause("t_graph_in")
    sleep.resume("t_graph_in")
    sleep.resume("t_graph")
    x.fill_(5.0)
    g.replay()
    torch.cuda.synchronize()
    assert float(y[-1].item()) == 16.0, "the graph ran at the same addresses"
    cachalot_torch.validate()


def test_bad_calls_are_errors_that_say_what_to_do(pytorch_policy):
    torch = pytorch_policy
    with sleep.region("t_bad"):
        a = torch.empty(MIB, device="cuda")
    sleep.pause("t_bad")
    with pytest.raises(cachalot_torch.CachalotError, match="paused already"):
        sleep.pause("t_bad")
    sleep.resume("t_bad")
    with pytest.raises(cachalot_torch.CachalotError, match="is not paused"):
        sleep.resume("t_bad")
    with pytest.raises(cachalot_torch.CachalotError, match="t_bad"):
        sleep.pause("t_no_such_tag")
    with pytest.raises(cachalot_torch.CachalotError, match="backup"):
        with sleep.region("t_bad2", backup="disk"):
            pass
    with pytest.raises(cachalot_torch.CachalotError, match="non-empty"):
        sleep.pause("")
    del a
    cachalot_torch.validate()


def test_the_torch_memory_saver_shape(pytorch_policy):
    torch = pytorch_policy
    saver = sleep.torch_memory_saver
    with saver.region(tag="t_tms", enable_cpu_backup=True):
        x = torch.full((32 * MIB,), 9, dtype=torch.uint8, device="cuda")
    address = x.data_ptr()
    saver.pause("t_tms")
    saver.resume("t_tms")
    assert x.data_ptr() == address and int(x.sum().item()) == 9 * 32 * MIB
    cachalot_torch.validate()


def test_the_cachalot_policy_says_which_setting_serves_tags(torch_gpu):
    if cachalot_torch.config()["policy"] != "cachalot":
        pytest.skip("the refusal is the cachalot policy's")
    with pytest.raises(cachalot_torch.CachalotError, match="policy:pytorch"):
        with sleep.region("t_refused"):
            pass

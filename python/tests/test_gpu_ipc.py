"""CUDA tensors sent to another process through torch.multiprocessing, with
cachalot on either side or both (the policy of CACHALOT_ALLOC_CONF), and with
PyTorch's own allocator on the other. Skips without a GPU."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

PROGRAM = pathlib.Path(__file__).with_name("ipc_program.py")


def _exchange(sender, receiver, native_conf=""):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if native_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = native_conf
    run = subprocess.run([sys.executable, str(PROGRAM), sender, receiver], env=env, capture_output=True,
                         text=True, timeout=300, check=False)  # fmt: skip
    lines = [l for l in run.stdout.splitlines() if l.startswith("{")]
    assert lines, f"no result (exit {run.returncode}): {run.stderr[-2000:]}"
    result = json.loads(lines[-1])
    print(f"\nipc {sender} -> {receiver} {native_conf}: {result}")
    return result


def _policy():
    conf = os.environ.get("CACHALOT_ALLOC_CONF", "")
    return "cachalot" if "policy:cachalot" in conf else "pytorch"


def test_cachalot_to_cachalot(torch_gpu):
    r = _exchange("cachalot", "cachalot")
    assert r.get("ok"), r
    assert r["receiver_closed"] and r["receiver_exit"] == 0, r


def test_native_to_cachalot(torch_gpu):
    r = _exchange("native", "cachalot")
    assert r.get("ok"), r


def test_cachalot_to_native(torch_gpu):
    r = _exchange("cachalot", "native")
    if _policy() == "pytorch":
        # Segments travel as PyTorch's own handles.
        assert r.get("ok"), r
    else:
        # Pages travel over cachalot's socket, which PyTorch cannot open: a
        # clear error in the receiver, never wrong values.
        assert "error" in r and not r.get("ok"), r


def test_expandable_segments_of_native_are_refused_clearly(torch_gpu):
    r = _exchange("native", "cachalot", "expandable_segments:True")
    if "error" in r:
        assert "expandable segment" in r["error"], r
    else:
        # Small tensors still travel as segments under expandable_segments.
        assert r.get("ok") is not None, r

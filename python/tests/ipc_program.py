"""One CUDA IPC exchange through torch.multiprocessing, run as a program:

    python ipc_program.py SENDER RECEIVER

SENDER and RECEIVER are `cachalot` (the drop-in allocator, with the policy of
CACHALOT_ALLOC_CONF) or `native` (PyTorch's own, with PYTORCH_CUDA_ALLOC_CONF).
The sender puts CUDA tensors of several sizes (a small-pool one at a non-zero
offset in its segment, a view with a storage offset, large ones over several
pages) on a queue to a spawned receiver, which checks their sums, adds 1 to
each in place and answers; the sender then checks that it sees the receiver's
writes (the same memory). Prints one JSON line: {"ok": ...} or {"error": ...}.
"""

import json
import sys

import torch
import torch.multiprocessing as mp

SIZES = [1000, 3 << 18, 45 << 18]  # float32 elements: 4 KB, 3 MiB, 45 MiB


def _use(kind):
    if kind == "cachalot":
        import cachalot_torch

        cachalot_torch.use()


def receive(kind, inbox, outbox):
    try:
        _use(kind)
        torch.cuda.init()
        tensors = inbox.get(timeout=120)
        sums = [float(t.double().sum()) for t in tensors]
        for t in tensors:
            t.add_(1)
        torch.cuda.synchronize()
        outbox.put({"sums": sums})
        del tensors
        inbox.get(timeout=120)
        outbox.put({"closed": True})
    except Exception as e:  # reported to the sender, which prints it
        outbox.put({"error": f"{type(e).__name__}: {e}"})


def main():
    sender, receiver = sys.argv[1], sys.argv[2]
    _use(sender)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=receive, args=(receiver, inbox, outbox))
    proc.start()
    keep = torch.zeros(100, device="cuda")  # the small tensor is not at its segment's start
    tensors = [torch.arange(n, device="cuda", dtype=torch.float32) % 977 for n in SIZES]
    big = torch.arange(SIZES[2], device="cuda", dtype=torch.float32) % 13
    tensors.append(big[12345:12345 + 4096])
    originals = [t.clone() for t in tensors]
    expected = [float(t.double().sum()) for t in tensors]
    torch.cuda.synchronize()
    inbox.put(tensors)
    got = outbox.get(timeout=180)
    result = {"sender": sender, "receiver": receiver}
    if "error" in got:
        result["error"] = got["error"]
    else:
        torch.cuda.synchronize()
        result["sums_match"] = got["sums"] == expected
        result["writes_seen"] = all(torch.equal(t, o + 1) for t, o in zip(tensors, originals))
        result["ok"] = result["sums_match"] and result["writes_seen"]
    inbox.put("done")
    closed = outbox.get(timeout=60) if "error" not in got else {}
    result["receiver_closed"] = bool(closed.get("closed"))
    proc.join(timeout=60)
    result["receiver_exit"] = proc.exitcode
    del keep
    if sender == "cachalot":
        import cachalot_torch

        cachalot_torch.validate()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

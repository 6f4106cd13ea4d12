#!/usr/bin/env python3
"""Check that a snapshot pickle written by cachalot reads in PyTorch's tools.

Usage: check_snapshot_viz.py SNAPSHOT.pickle[.gz] [OUTDIR]

Without PyTorch: loads the pickle with the standard library and checks every key
and type that `python3 -m torch.cuda._memory_viz stats|trace|trace_plot|
segment_plot` and the memory_viz page read, and the sums `stats` asserts.
With PyTorch importable: also runs those four commands on the file and checks
their output. Exits 1 on the first failure, naming it.
"""

import gzip
import os
import pickle
import subprocess
import sys
import tempfile

BLOCK_STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom"}


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    expect(raw[:1] == b"\x80" and raw[1] in (2, 3, 4), f"pickle protocol byte {raw[1:2]!r} (memory_viz reads 2-4)")
    return pickle.loads(raw)


def check_frames(frames, where):
    expect(isinstance(frames, list), f"{where}: frames is a list")
    for fr in frames:
        for key, typ in (("filename", str), ("line", int), ("name", str)):
            expect(isinstance(fr.get(key), typ), f"{where}: frame key {key} is {typ.__name__}")


def check_segments(data):
    segs = data["segments"]
    expect(isinstance(segs, list), "segments is a list")
    for i, seg in enumerate(segs):
        where = f"segments[{i}]"
        for key in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream"):
            expect(is_int(seg.get(key)), f"{where}.{key} is an int")
        expect(seg.get("segment_type") in ("small", "large"), f"{where}.segment_type")
        expect(isinstance(seg.get("segment_pool_id"), tuple), f"{where}.segment_pool_id is a tuple")
        expect(isinstance(seg.get("is_expandable"), bool), f"{where}.is_expandable is a bool")
        check_frames(seg.get("frames"), where)
        blocks = seg.get("blocks")
        expect(isinstance(blocks, list) and blocks, f"{where}.blocks is a non-empty list")
        addr = seg["address"]
        allocated = active = requested = 0
        free_internal = free_external = used = 0
        for j, b in enumerate(blocks):
            bw = f"{where}.blocks[{j}]"
            for key in ("address", "size", "requested_size"):
                expect(is_int(b.get(key)), f"{bw}.{key} is an int")
            expect(b.get("state") in BLOCK_STATES, f"{bw}.state")
            check_frames(b.get("frames"), bw)
            expect(b["address"] == addr, f"{bw} starts where the previous block ends")
            addr += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                requested += b["requested_size"]
            if b["state"] == "active_allocated":
                allocated += b["size"]
                # What `stats` (segsum) computes: requested bytes used, the rest internal free.
                used += b["requested_size"]
                free_internal += b["size"] - b["requested_size"]
                expect(b["requested_size"] <= b["size"], f"{bw}: requested_size <= size")
            else:
                free_external += b["size"]
        expect(addr - seg["address"] == seg["total_size"], f"{where}: blocks tile the segment")
        expect(seg["allocated_size"] == allocated, f"{where}.allocated_size is the sum of allocated blocks")
        expect(seg["active_size"] == active, f"{where}.active_size is the sum of active blocks")
        expect(seg["requested_size"] == requested, f"{where}.requested_size is the sum over active blocks")
        expect(free_internal + free_external + used == seg["total_size"], f"{where}: segsum's assertion holds")
    return len(segs)


def check_traces(data):
    traces = data["device_traces"]
    expect(isinstance(traces, list), "device_traces is a list (one per device)")
    n = 0
    for d, entries in enumerate(traces):
        expect(isinstance(entries, list), f"device_traces[{d}] is a list")
        for k, e in enumerate(entries):
            where = f"device_traces[{d}][{k}]"
            expect(e.get("action") in ACTIONS, f"{where}.action")
            addr_key = "device_free" if e["action"] == "oom" else "addr"
            for key in (addr_key, "size", "stream", "time_us"):
                expect(is_int(e.get(key)), f"{where}.{key} is an int")
            check_frames(e.get("frames"), where)
            n += 1
    return n


def check_settings(data):
    s = data["allocator_settings"]
    expect(isinstance(s, dict), "allocator_settings is a dict")
    expect(isinstance(s.get("PYTORCH_CUDA_ALLOC_CONF"), str), "allocator_settings.PYTORCH_CUDA_ALLOC_CONF")
    expect(is_int(s.get("max_split_size")), "allocator_settings.max_split_size")
    expect(isinstance(s.get("expandable_segments"), bool), "allocator_settings.expandable_segments")
    expect(isinstance(s.get("roundup_power2_divisions"), dict), "allocator_settings.roundup_power2_divisions")


def run_torch_tools(path, outdir):
    plain = os.path.join(outdir, "snapshot.pickle")
    with open(path, "rb") as f:
        raw = f.read()
    with open(plain, "wb") as f:  # _memory_viz opens the file with plain open()
        f.write(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    # The four tools at once: each starts its own Python and imports torch.
    runs = {}
    for cmd in ("stats", "trace", "trace_plot", "segment_plot"):
        args = [sys.executable, "-m", "torch.cuda._memory_viz", cmd, plain]
        if cmd.endswith("_plot"):
            args += ["-o", os.path.join(outdir, f"{cmd}.html")]
        runs[cmd] = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for cmd, proc in runs.items():
        stdout, stderr = proc.communicate()
        expect(proc.returncode == 0, f"_memory_viz {cmd} exited {proc.returncode}: {stderr[-2000:]}")
        if cmd == "stats":
            expect("total_reserved" in stdout, "_memory_viz stats prints total_reserved")
        elif cmd == "trace":
            expect("entries" in stdout, "_memory_viz trace prints the entries")
        else:
            with open(os.path.join(outdir, f"{cmd}.html")) as f:
                html = f.read()
            expect("snapshot.pickle" in html and "base64" in html, f"_memory_viz {cmd} embeds the snapshot")
        print(f"ok: python3 -m torch.cuda._memory_viz {cmd}")


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    path = sys.argv[1]
    data = load(path)
    expect(isinstance(data, dict), "the top level is a dict")
    for key in ("segments", "device_traces", "allocator_settings"):
        expect(key in data, f"top-level key {key}")
    segs = check_segments(data)
    events = check_traces(data)
    check_settings(data)
    pickle.dumps(data)  # what trace_plot / segment_plot do before embedding it
    print(f"ok: {path}: {segs} segments, {events} trace entries follow PyTorch's snapshot schema")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skip: PyTorch is not importable here; _memory_viz itself not run")
        return
    outdir = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="cachalot-viz-")
    os.makedirs(outdir, exist_ok=True)
    run_torch_tools(path, outdir)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Merges the GPU benchmark's JSON files (native.json from native_bench.py,
cachalot.json from the Rust gpu bench) in DIR into markdown tables.

Usage: table.py DIR
"""
import json
import os
import sys

NAMES = {
    "pytorch": "PyTorch native",
    "async": "cudaMallocAsync (kept pool)",
    "cachalot:pytorch": "cachalot, pytorch policy",
    "cachalot:cachalot": "cachalot, cachalot policy",
}


def mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


def calls(r):
    if "memory_calls_first" not in r:
        return "-"
    return f"{r['memory_calls_first']} / {r['memory_calls_per_later_pass']:.1f}"


def load(d, name):
    path = os.path.join(d, name)
    if not os.path.exists(path):
        return {"replay": {}, "scaling": {}}
    with open(path) as fh:
        return json.load(fh)


def main():
    d = sys.argv[1]
    runs = [load(d, "native.json"), load(d, "cachalot.json")]
    replay, scaling = {}, {}
    for run in runs:
        for trace, by in run["replay"].items():
            replay.setdefault(trace, {}).update(by)
        scaling.update(run["scaling"])
    gpu = open(os.path.join(d, "gpu.txt")).read().strip() if os.path.exists(os.path.join(d, "gpu.txt")) else "?"
    print(f"GPU: {gpu}\n")
    print("| trace | allocator | ns/op first pass | ns/op steady (median) | reserved MiB (allocator) "
          "| device used MiB (cuMemGetInfo) | simulator predicted MiB | driver memory calls: first pass / later pass |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for trace in sorted(replay):
        for key in NAMES:
            r = replay[trace].get(key)
            if not r:
                continue
            print(f"| {trace} | {NAMES[key]} | {r['ns_first']:.0f} | {r['ns_steady']:.0f} | "
                  f"{mib(r.get('reserved_after_first'))} | {mib(r.get('device_used_after_first'))} | "
                  f"{mib(r.get('sim_reserved'))} | {calls(r)} |")
    print("\n| trace | cachalot policy steady / PyTorch native steady | pytorch policy steady / PyTorch native |")
    print("|---|---:|---:|")
    for trace in sorted(replay):
        base = replay[trace].get("pytorch")
        if not base:
            continue
        cells = []
        for key in ("cachalot:cachalot", "cachalot:pytorch"):
            r = replay[trace].get(key)
            cells.append(f"{r['ns_steady'] / base['ns_steady']:.3f}" if r else "-")
        print(f"| {trace} | {cells[0]} | {cells[1]} |")
    print("\n| allocator | 1 thread | 2 threads | 4 threads | 8 threads | 8 / 1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for key in NAMES:
        s = scaling.get(key)
        if not s:
            continue
        cells = [f"{s[t]:.2f}" if t in s else "-" for t in ("1", "2", "4", "8")]
        ratio = f"{s['8'] / s['1']:.2f}" if "1" in s and "8" in s else "-"
        print(f"| {NAMES[key]} | {' | '.join(cells)} | {ratio} |")
    print("\n(ops per microsecond over all threads, each thread on its own stream)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Runs the native contenders of cachalot's GPU benchmark (PyTorch's caching
allocator and cudaMallocAsync with a kept pool) over op lists, and writes JSON.

Usage: native_bench.py --ops DIR --out FILE.json [--so PREBUILT.so] [--build-dir DIR]
                       [--passes N] [--steps N] [--threads 1,2,4,8] [--repeats 3]
                       [--plugin libcachalot_torch.so] [--turns N] [--timed N]

With --plugin, each op list is also replayed in this one process by all four
contenders in turn: PyTorch's allocator, cudaMallocAsync, and cachalot's
plug-in with the pytorch and with the cachalot policy (a private copy of the
library each). Each takes a first pass from an empty cache, then --turns turns
of one untimed pass and --timed timed ones. The JSON's "one_process" part has,
per op list and contender, the first pass, every turn's ns per op and their
median, and every turn's ratio to PyTorch's allocator with their median and
the worst.

The extension (native_alloc.cpp beside this file) is loaded from --so when given
and present, else compiled with torch.utils.cpp_extension.load into --build-dir.
"""
import argparse
import glob
import importlib.util
import json
import os
import statistics
import sys
import time

import torch


def load_extension(so, build_dir):
    if so and os.path.exists(so):
        spec = importlib.util.spec_from_file_location("cachalot_native_bench", so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from torch.utils.cpp_extension import load

    os.makedirs(build_dir, exist_ok=True)
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_alloc.cpp")
    start = time.time()
    module = load(name="cachalot_native_bench", sources=[src], extra_cflags=["-O2"],
                  build_directory=build_dir, with_cuda=True, verbose=False)
    print(f"compiled the extension in {time.time() - start:.0f} s", file=sys.stderr)
    return module


def expected_bytes(path):
    with open(path) as fh:
        return sum(int(line.split()[2]) for line in fh if line.startswith("a "))


ONE_PROCESS = ["pytorch", "async", "cachalot:pytorch", "cachalot:cachalot"]


def one_process(ext, ops_dir, plugin, turns, timed):
    """All four contenders in this process, taking turns, per op list."""
    ext.set_plugin(plugin)
    out = {"turns": turns, "timed": timed, "traces": {}}
    for path in sorted(glob.glob(os.path.join(ops_dir, "*.ops"))):
        trace = os.path.basename(path)[:-4]
        by = ext.turns(path, ONE_PROCESS, turns, timed)
        native = by["pytorch"]["turns"]
        for name, r in by.items():
            r["steady"] = statistics.median(r["turns"])
            r["ratios"] = [c / n for c, n in zip(r["turns"], native)]
            r["ratio_median"], r["ratio_worst"] = statistics.median(r["ratios"]), max(r["ratios"])
        out["traces"][trace] = by
        print(f"{trace:16} one process: " + ", ".join(
            f"{name} {r['steady']:.0f} ns/op ({r['ratio_median']:.3f}; worst {r['ratio_worst']:.3f})"
            for name, r in by.items()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--so")
    ap.add_argument("--build-dir", default="/tmp/cachalot-ext")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3, help="scaling runs per thread count (median)")
    ap.add_argument("--contenders", default="pytorch,async")
    ap.add_argument("--plugin", help="libcachalot_torch.so, for the one-process replay")
    ap.add_argument("--turns", type=int, default=15)
    ap.add_argument("--timed", type=int, default=3, help="timed passes per turn")
    args = ap.parse_args()

    torch.cuda.init()
    ext = load_extension(args.so, args.build_dir)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "replay": {}, "scaling": {}}
    contenders = args.contenders.split(",")
    for path in sorted(glob.glob(os.path.join(args.ops, "*.ops"))):
        trace = os.path.basename(path)[:-4]
        result["replay"][trace] = {}
        for name in contenders:
            r = ext.replay(path, name, args.passes)
            if r["requested_bytes_per_pass"] != expected_bytes(path):
                sys.exit(f"{trace}: the extension read {r['requested_bytes_per_pass']} requested bytes, "
                         f"the file holds {expected_bytes(path)}")
            ns = r["ns_per_op"]
            r["ns_first"] = ns[0]
            r["ns_steady"] = statistics.median(ns[1:]) if len(ns) > 1 else ns[0]
            result["replay"][trace][name] = r
            print(f"{trace:16} {name:8} first {ns[0]:8.0f} ns/op  steady {r['ns_steady']:8.0f} ns/op  "
                  f"reserved {r['reserved_after_first']}  device used {r['device_used_after_first']}")
    if args.plugin:
        result["one_process"] = one_process(ext, args.ops, args.plugin, args.turns, args.timed)
    for name in contenders:
        result["scaling"][name] = {}
        for threads in [int(t) for t in args.threads.split(",")]:
            runs = [ext.scaling(name, threads, args.steps) for _ in range(args.repeats)]
            rate = statistics.median(runs)
            result["scaling"][name][str(threads)] = rate
            print(f"scaling {name:8} {threads} threads: {rate:.2f} ops/us (median of "
                  f"{', '.join(f'{r:.2f}' for r in runs)})")
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()

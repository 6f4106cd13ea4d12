#!/usr/bin/env python3
"""Runs the native contenders of cachalot's GPU benchmark (PyTorch's caching
allocator and cudaMallocAsync with a kept pool) over op lists, and writes JSON.

Usage: native_bench.py --ops DIR --out FILE.json [--so PREBUILT.so] [--build-dir DIR]
                       [--passes N] [--steps N] [--threads 1,2,4,8]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--so")
    ap.add_argument("--build-dir", default="/tmp/cachalot-ext")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--contenders", default="pytorch,async")
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
    for name in contenders:
        result["scaling"][name] = {}
        for threads in [int(t) for t in args.threads.split(",")]:
            rate = ext.scaling(name, threads, args.steps)
            result["scaling"][name][str(threads)] = rate
            print(f"scaling {name:8} {threads} threads: {rate:.2f} ops/us")
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()

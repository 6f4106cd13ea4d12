#!/usr/bin/env python3
"""Runs the native contenders of cachalot's GPU benchmark (PyTorch's caching
allocator, as configured by default and with expandable_segments, and
cudaMallocAsync with a kept pool) over op lists, and writes JSON.

Usage: native_bench.py --ops DIR --out FILE.json [--so PREBUILT.so] [--build-dir DIR]
                       [--passes N] [--steps N] [--threads 1,2,4,8] [--repeats 3]
                       [--plugin libcachalot_torch.so] [--turns N] [--timed N]
                       [--rmm DIR]

With --plugin, each op list is also replayed in this one process by all the
contenders in turn: PyTorch's allocator (pytorch, pytorch:expandable),
cudaMallocAsync, cachalot's plug-in
with the pytorch and with the cachalot policy (a private copy of the library
each), and, where the extension was built with RMM, RMM's pool, arena and
async resources (rmm:pool, rmm:arena, rmm:async). In --cold rounds each takes
a first pass from an empty cache (one pass is at the mercy of the host: a
pause of it can double one), then --turns turns of one untimed pass and
--timed timed ones. The JSON's "one_process" part has, per op list and
contender, every round's first pass, their median and their ratios to PyTorch's
allocator's in the same round with their median, every turn's ns per op and
their median, every turn's ratio to PyTorch's allocator with their median and
the worst, the reserved bytes where the
allocator counts them, and "failed" with the reason for a contender that threw
(it is left out of the passes after that).

The extension (native_alloc.cpp beside this file) is loaded from --so when given
and present, else compiled with torch.utils.cpp_extension.load into --build-dir.
The RMM contenders (rmm_contenders.cu beside it) are compiled in when --rmm
(default: the folder rmm beside this script's folder, where
scripts/build-gpu-bin.sh puts them) holds the wheels librmm_cu13-*.whl and
rapids_logger-*.whl: they are unzipped to /tmp/cachalot-rmm and nvcc compiles
rmm_contenders.cu against their headers (C++20, RMM's own CCCL first). Without
the wheels the extension is built as before and the rmm contenders are skipped.
"""
import argparse
import ctypes
import glob
import importlib.util
import json
import os
import statistics
import sys
import time
import zipfile

import torch


HERE = os.path.dirname(os.path.abspath(__file__))
RMM_WHEELS = ("librmm_cu13-*.whl", "rapids_logger-*.whl")
RMM_UNPACKED = "/tmp/cachalot-rmm"


def unpack_rmm(rmm_dir, dest=RMM_UNPACKED):
    """Unzips the RMM wheels in rmm_dir into dest (once per wheel) and loads
    their libraries; returns their include and library folders, or None (with
    a note) when a wheel is missing."""
    wheels = []
    for pattern in RMM_WHEELS:
        found = sorted(glob.glob(os.path.join(rmm_dir, pattern))) if rmm_dir else []
        if not found:
            print(f"note: no {pattern} in {rmm_dir}: the extension is built without RMM and the rmm "
                  f"contenders are skipped (scripts/build-gpu-bin.sh fetches the wheels)", file=sys.stderr)
            return None
        wheels.append(found[-1])
    for wheel in wheels:
        done = os.path.join(dest, ".unpacked-" + os.path.basename(wheel))
        if not os.path.exists(done):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(dest)
            open(done, "w").close()
    rmm = {
        # RMM's own CCCL (include/rapids) comes first, ahead of the toolkit's.
        "include": [f"{dest}/librmm/include/rapids", f"{dest}/librmm/include", f"{dest}/rapids_logger/include"],
        "lib": [f"{dest}/rapids_logger/lib64", f"{dest}/librmm/lib64"],
    }
    # librmm.so finds librapids_logger.so only beside itself or on the loader's
    # path: loaded first, in this order, each is found by its name when the
    # extension (or librmm.so) asks for it, as the wheels' own load_library does.
    for lib, name in zip(rmm["lib"], ("librapids_logger.so", "librmm.so")):
        ctypes.CDLL(os.path.join(lib, name), mode=os.RTLD_LOCAL)
    return rmm


def load_extension(so, build_dir, rmm=None):
    if so and os.path.exists(so):
        spec = importlib.util.spec_from_file_location("cachalot_native_bench", so)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from torch.utils.cpp_extension import load

    os.makedirs(build_dir, exist_ok=True)
    sources = [os.path.join(HERE, "native_alloc.cpp")]
    cflags, cuda_cflags, ldflags = ["-O2"], [], []
    if rmm:
        # rmm_contenders.cu alone is compiled by nvcc, with RMM's include
        # folders (-I, searched before the -isystem folders of torch and the
        # toolkit) and C++20; native_alloc.cpp keeps torch's flags.
        sources.append(os.path.join(HERE, "rmm_contenders.cu"))
        cflags.append("-DCACHALOT_WITH_RMM")
        cuda_cflags = [f"-I{d}" for d in rmm["include"]] + ["-std=c++20", "-O2", "-DCACHALOT_WITH_RMM"]
        ldflags = ([f"-L{d}" for d in rmm["lib"]] + [f"-Wl,-rpath,{d}" for d in rmm["lib"]] +
                   ["-Wl,--push-state,--no-as-needed", "-lrapids_logger", "-lrmm", "-Wl,--pop-state"])
    start = time.time()
    module = load(name="cachalot_native_bench", sources=sources, extra_cflags=cflags,
                  extra_cuda_cflags=cuda_cflags, extra_ldflags=ldflags,
                  build_directory=build_dir, with_cuda=True, verbose=False)
    print(f"compiled the extension{' with RMM' if rmm else ''} in {time.time() - start:.0f} s", file=sys.stderr)
    return module


def has_rmm(ext):
    """Whether the extension holds the rmm contenders (an older build has no has_rmm)."""
    return bool(getattr(ext, "has_rmm", lambda: False)())


def expected_bytes(path):
    with open(path) as fh:
        return sum(int(line.split()[2]) for line in fh if line.startswith("a "))


ONE_PROCESS = ["pytorch", "pytorch:expandable", "async", "cachalot:pytorch", "cachalot:cachalot"]
# Appended to ONE_PROCESS where the extension was built with RMM; the arena
# before rmm:async, since it is sized by the memory free when it is made.
RMM_CONTENDERS = ["rmm:pool", "rmm:arena", "rmm:async"]


def summary(name, r):
    if "steady" not in r:
        return f"{name} FAILED ({r.get('failed')})"
    text = f"{name} {r['steady']:.0f} ns/op"
    if "ratio_median" in r:
        text += f" ({r['ratio_median']:.3f}; worst {r['ratio_worst']:.3f})"
    if "failed" in r:
        text += f" [failed after {len(r['turns'])} turns: {r['failed']}]"
    return text


def summarize(r, native):
    """Adds to one contender's turns() record its medians and its ratios to
    PyTorch's allocator's record `native`, round by round and turn by turn."""
    if r["firsts"]:
        r["first"] = statistics.median(r["firsts"])
    if r["firsts"] and native["firsts"]:
        r["first_ratios"] = [c / n for c, n in zip(r["firsts"], native["firsts"])]
        r["first_ratio_median"] = statistics.median(r["first_ratios"])
    if not r["turns"]:
        return
    r["steady"] = statistics.median(r["turns"])
    if native["turns"]:
        r["ratios"] = [c / n for c, n in zip(r["turns"], native["turns"])]
        r["ratio_median"], r["ratio_worst"] = statistics.median(r["ratios"]), max(r["ratios"])


def one_process(ext, ops_dir, plugin, turns, timed, cold):
    """All contenders in this process, taking turns, per op list: `cold`
    rounds of a first pass from an empty cache each, then the turns."""
    ext.set_plugin(plugin)
    names = ONE_PROCESS + (RMM_CONTENDERS if has_rmm(ext) else [])
    if not has_rmm(ext):
        print("note: the extension has no RMM: rmm:pool, rmm:arena and rmm:async are skipped", file=sys.stderr)
    out = {"turns": turns, "timed": timed, "cold": cold, "contenders": names, "traces": {}, "peak_live": {}}
    for path in sorted(glob.glob(os.path.join(ops_dir, "*.ops"))):
        trace = os.path.basename(path)[:-4]
        by = ext.turns(path, names, turns, timed, cold)
        for r in by.values():
            summarize(r, by["pytorch"])
        out["traces"][trace] = by
        out["peak_live"][trace] = ext.peak_live(path)
        print(f"{trace:16} one process: " + ", ".join(summary(name, r) for name, r in by.items()))
    return out


def failed_natives(one):
    """The one-process contenders other than RMM's that threw, as 'trace: name'."""
    return [f"{trace}: {name}" for trace, by in one["traces"].items()
            for name, r in by.items() if "failed" in r and name in ONE_PROCESS]


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
    ap.add_argument("--contenders", default="pytorch,pytorch:expandable,async")
    ap.add_argument("--plugin", help="libcachalot_torch.so, for the one-process replay")
    ap.add_argument("--turns", type=int, default=15)
    ap.add_argument("--timed", type=int, default=3, help="timed passes per turn")
    ap.add_argument("--cold", type=int, default=5, help="first passes from an empty cache per contender")
    ap.add_argument("--rmm", default=os.path.join(os.path.dirname(HERE), "rmm"),
                    help="folder of the librmm-cu13 and rapids-logger wheels (the rmm contenders)")
    args = ap.parse_args()

    torch.cuda.init()
    ext = load_extension(args.so, args.build_dir, unpack_rmm(args.rmm))
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "replay": {}, "scaling": {}}
    if has_rmm(ext):
        result["rmm"] = ext.rmm_version()
        print(f"rmm contenders built from {result['rmm']}")
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
        result["one_process"] = one_process(ext, args.ops, args.plugin, args.turns, args.timed,
                                            args.cold)
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
    failed = failed_natives(result.get("one_process", {"traces": {}}))
    if failed:
        sys.exit("one-process contenders failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()

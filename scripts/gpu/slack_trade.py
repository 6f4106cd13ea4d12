#!/usr/bin/env python3
"""The memory-for-speed trade of the cachalot policy on one op list, measured in
one process: PyTorch's caching allocator, and cachalot's plug-in with its own
policy at the default settings (a reuse slack of 0.2) and at smaller
`cachalot_reuse_slack` values
(one private copy of the plug-in each), taking turns as in native_bench.py's
one-process run: `--cold` rounds of a first pass from an empty cache each,
then `--turns` turns of one untimed and `--timed` timed passes. Prints a
markdown table (first pass and steady state against PyTorch's in the same
round or turn, medians) and writes it to --out. The plug-in's reserved bytes
are not read here: `cachalot tune --space cachalot_reuse_slack=...` gives them
for the same op list on the simulated device, which the GPU bench finds exact.

Usage: slack_trade.py --ops FILE.ops --plugin libcachalot_torch.so --out FILE.md
                      [--slacks 0.035,0.12] [--so PREBUILT.so] [--build-dir DIR]
                      [--rmm DIR] [--cold 5] [--turns 3] [--timed 3]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from native_bench import load_extension, summarize, unpack_rmm  # noqa: E402


def contenders(slacks):
    """PyTorch's allocator, then the cachalot policy at each setting."""
    names = ["pytorch", "cachalot:cachalot"]
    names += [f"cachalot:cachalot,cachalot_reuse_slack:{s}" for s in slacks]
    return names


def label(name):
    if name == "pytorch":
        return "PyTorch native"
    conf = name.split(":", 1)[1]
    return "cachalot policy" + ("" if conf == "cachalot" else ", " + conf.split(",", 1)[1])


def row(r, native):
    """One contender's cells: first pass and steady ns/op with their ratios to
    PyTorch's (medians of the per-round and per-turn ratios)."""
    summarize(r, native)
    if "first_ratio_median" not in r or "ratio_median" not in r:
        return f"failed: {r.get('failed', 'no passes')}"
    return (f"{r['first']:.0f} | {r['first_ratio_median']:.2f} | {r['steady']:.0f} | "
            f"{r['ratio_median']:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", required=True, help="one op list (trace-to-ops.py)")
    ap.add_argument("--plugin", required=True, help="libcachalot_torch.so")
    ap.add_argument("--out", required=True)
    ap.add_argument("--slacks", default="0.035,0.12")
    ap.add_argument("--so")
    ap.add_argument("--build-dir", default="/tmp/cachalot-ext")
    ap.add_argument("--rmm", help="the RMM wheels' folder, if the extension was built with them")
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--timed", type=int, default=3)
    args = ap.parse_args()
    slacks = [s for s in args.slacks.split(",") if s]
    for s in slacks:
        if not 0 <= float(s) <= 1:
            sys.exit(f"slack {s}: expected a fraction between 0 and 1")

    torch.cuda.init()
    ext = load_extension(args.so, args.build_dir, unpack_rmm(args.rmm) if args.rmm else None)
    ext.set_plugin(args.plugin)
    names = contenders(slacks)
    by = ext.turns(args.ops, names, args.turns, args.timed, args.cold)
    trace = os.path.basename(args.ops).removesuffix(".ops")
    lines = [
        f"The cachalot policy's memory-for-speed trade on {trace} (one process, {args.cold} first "
        f"passes each, {args.turns} turns of {args.timed} timed passes):",
        "",
        "| allocator | ns/op first pass | / native | ns/op steady | / native |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {label(n)} | {row(by[n], by['pytorch'])} |" for n in names]
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as fh:
        fh.write(text)
    failed = [n for n in names if by[n].get("failed")]
    if failed:
        sys.exit("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()

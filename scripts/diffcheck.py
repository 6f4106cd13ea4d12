#!/usr/bin/env python3
"""Differential checker: seeded random allocator programs on PyTorch's own CUDA
allocator and on cachalot's pytorch policy, torch.cuda.memory_stats() compared
after every operation.

A program is a seeded list of operations on three streams (the default and two
side streams): allocate (sizes drawn around the allocator's boundaries: the
512-byte rounding, the 1 MiB small-block limit, the 2 and 20 MiB segment
sizes, up to 300 MiB), free, record_stream onto another stream, empty_cache,
and reset_peak_memory_stats. After each free of a tensor used on another
stream the process synchronizes the device (so that the event of the free has
completed before the allocator next looks: both allocators then see the same
thing), and after every operation it hashes every memory_stats() figure.

For each configuration (PYTORCH_CUDA_ALLOC_CONF syntax), two processes run the
same programs at the same time, one under PyTorch's allocator and one under
cachalot (`CACHALOT_ALLOC_CONF=policy:pytorch,<conf>`); the driver compares
their hashes operation by operation and, for the first programs that differ,
runs them again to name the keys that differ, and at which operation.

MemPools are in the programs (created, routed to as `use_mem_pool` does,
left, deleted); graph captures are not yet.

    python3 scripts/diffcheck.py --programs 5000 --ops 120 --json out.json --markdown out.md
"""

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time

CONFIGS = {
    "native": "",
    "expandable": "expandable_segments:True",
    "max_split_size_mb": "max_split_size_mb:64",
    "roundup_power2_divisions": "roundup_power2_divisions:4",
}
KIB, MIB = 1 << 10, 1 << 20
STREAMS = 3


# ----------------------------------------------------------------------------
# Programs (pure Python: the same seed gives the same program everywhere).
# ----------------------------------------------------------------------------


def _size(rng):
    """A request size, drawn near the allocator's boundaries more than not."""
    kind = rng.random()
    if kind < 0.35:
        return rng.choice([1, 511, 512, 513, 4 * KIB, 64 * KIB, MIB - 1, MIB, MIB + 1]) + rng.randrange(0, 3) * 512
    if kind < 0.6:
        return rng.randrange(1, MIB)
    if kind < 0.85:
        base = rng.choice([2 * MIB, 10 * MIB, 20 * MIB, 64 * MIB])
        return max(1, base + rng.randrange(-MIB, MIB))
    return rng.randrange(MIB, 300 * MIB)


MAX_POOLS = 2


def program(seed, ops):
    """`ops` operations: ("alloc", size, stream), ("free", k), ("record", k,
    stream), ("empty_cache",), ("reset_peak",), and MemPool ones:
    ("pool_new",), ("pool_enter", j) (this thread's allocations go to pool j,
    as in `use_mem_pool`), ("pool_exit",), ("pool_del", j); k indexes the
    live tensors in allocation order, j the live pools in creation order."""
    rng = random.Random(seed)
    live, pools, routed, out = 0, 0, False, []
    for _ in range(ops):
        r = rng.random()
        if r < 0.03:
            pool_op = _pool_op(rng, pools, routed)
            if pool_op is not None:
                out.append(pool_op)
                pools += {"pool_new": 1, "pool_del": -1}.get(pool_op[0], 0)
                routed = {"pool_enter": True, "pool_exit": False}.get(pool_op[0], routed)
                continue
        if live and r < 0.40:
            out.append(("free", rng.randrange(live)))
            live -= 1
        elif live and r < 0.50:
            out.append(("record", rng.randrange(live), rng.randrange(STREAMS)))
        elif r < 0.52:
            out.append(("empty_cache",))
        elif r < 0.53:
            out.append(("reset_peak",))
        else:
            out.append(("alloc", _size(rng), rng.randrange(STREAMS)))
            live += 1
    return out


def _pool_op(rng, pools, routed):
    """A MemPool operation that is valid now, or None. A pool is deleted only
    while no route is open (PyTorch 2.11 aborts otherwise)."""
    if routed:
        return ("pool_exit",)
    choices = []
    if pools < MAX_POOLS:
        choices.append(("pool_new",))
    if pools:
        choices.append(("pool_enter", rng.randrange(pools)))
        choices.append(("pool_del", rng.randrange(pools)))
    return rng.choice(choices) if choices else None


# ----------------------------------------------------------------------------
# Worker: runs programs under one allocator, prints one hash per operation.
# ----------------------------------------------------------------------------


def _digest(stats):
    return hashlib.blake2b(json.dumps(stats, sort_keys=True).encode(), digest_size=8).hexdigest()


def _stats_reader(torch, full):
    """memory_stats() flattened (to name keys), or the nested form PyTorch
    flattens it from (the same figures, cheaper to read for a hash)."""
    if full:
        return torch.cuda.memory_stats
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is None:
        return lambda: _digest(torch.cuda.memory_stats())
    return lambda: _digest(raw(torch.cuda.current_device()))


def run_program(torch, streams, ops, full):
    """Runs one program; returns each operation's statistics hash (or, with
    `full`, the statistics themselves). The device is synchronized after each
    free of a tensor used on another stream, so that its event has completed
    before the allocator next looks."""
    live, recorded, trail, pools = [], [], [], []
    routed = None
    device = torch.cuda.current_device()
    read = _stats_reader(torch, full)
    for op in ops:
        if op[0] == "pool_new":
            pools.append(torch.cuda.MemPool())
        elif op[0] == "pool_enter":
            routed = pools[op[1]]
            torch._C._cuda_beginAllocateCurrentThreadToPool(device, routed.id)
        elif op[0] == "pool_exit":
            torch._C._cuda_endAllocateToPool(device, routed.id)
            torch._C._cuda_releasePool(device, routed.id)
            routed = None
        elif op[0] == "pool_del":
            del pools[op[1]]
        elif op[0] == "alloc":
            with torch.cuda.stream(streams[op[2]]):
                live.append(torch.empty(op[1], dtype=torch.uint8, device="cuda"))
            recorded.append(False)
        elif op[0] == "free":
            del live[op[1]]
            if recorded.pop(op[1]):
                torch.cuda.synchronize()
        elif op[0] == "record":
            live[op[1]].record_stream(streams[op[2]])
            recorded[op[1]] = True
        elif op[0] == "empty_cache":
            torch.cuda.empty_cache()
        else:
            torch.cuda.reset_peak_memory_stats()
        trail.append(read())
    if routed is not None:
        torch._C._cuda_endAllocateToPool(device, routed.id)
        torch._C._cuda_releasePool(device, routed.id)
        routed = None
    live.clear()
    pools.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    return trail


def worker(args):
    import torch

    if args.allocator == "cachalot":
        import cachalot_torch

        cachalot_torch.use()
    torch.cuda.init()
    streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(STREAMS - 1)]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else range(args.first, args.first + args.programs)
    for seed in seeds:
        trail = run_program(torch, streams, program(seed, args.ops), args.full)
        print(json.dumps({"seed": seed, "trail": trail}), flush=True)
    if args.allocator == "cachalot":
        cachalot_torch.validate()


# ----------------------------------------------------------------------------
# Driver: both allocators per configuration, side by side, then the comparison.
# ----------------------------------------------------------------------------


def _worker_cmd(allocator, args, seeds=None, full=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", allocator, "--ops", str(args.ops)]
    if seeds:
        return cmd + ["--seeds", ",".join(map(str, seeds))] + (["--full"] if full else [])
    return cmd + ["--programs", str(args.programs), "--first", str(args.first)]


def _env(allocator, conf):
    env = dict(os.environ)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
        env.pop(key, None)
    if allocator == "native":
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        env["CACHALOT_ALLOC_CONF"] = "policy:pytorch" + ("," + conf if conf else "")
    return env


def _trails(stdout):
    return {x["seed"]: x["trail"] for x in map(json.loads, (l for l in stdout.splitlines() if l.startswith("{")))}


def first_difference(native, other):
    """`(operation, [keys])` of the first operation whose statistics differ."""
    for i, (a, b) in enumerate(zip(native, other)):
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)) if isinstance(a, dict) else []
            return i, keys
    return (min(len(native), len(other)), []) if len(native) != len(other) else None


def compare(native, other):
    """`(programs compared, [seeds that differ])`."""
    differ = [s for s in sorted(native) if native[s] != other.get(s)]
    differ += [s for s in sorted(other) if s not in native]
    return len(native), differ


def _explain(name, conf, args, seeds):
    """Runs differing programs again with the whole statistics."""
    out = []
    runs = {a: subprocess.run(_worker_cmd(a, args, seeds, full=True), env=_env(a, conf), capture_output=True,
                              text=True, check=False) for a in ("native", "cachalot")}  # fmt: skip
    full = {a: _trails(r.stdout) for a, r in runs.items()}
    for seed in seeds:
        a, b = full["native"].get(seed), full["cachalot"].get(seed)
        if a is None or b is None:
            out.append(f"seed {seed}: a rerun failed")
            continue
        found = first_difference(a, b)
        if found is None:
            out.append(f"seed {seed}: equal when run again alone (timing)")
            continue
        i, keys = found
        op = program(seed, args.ops)[i] if i < args.ops else None
        shown = ", ".join(f"{k} {b[i].get(k)} vs {a[i].get(k)}" for k in keys[:6]) if i < min(len(a), len(b)) else ""
        out.append(f"seed {seed}: operation {i} {op}: {shown}")
    return out


def driver(args):
    names = args.configs.split(",")
    started = time.time()
    procs = {}
    for name in names:
        for allocator in ("native", "cachalot"):
            procs[(name, allocator)] = subprocess.Popen(
                _worker_cmd(allocator, args), env=_env(allocator, CONFIGS[name]),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
    outputs = {key: p.communicate() + (p.returncode,) for key, p in procs.items()}
    rows = []
    for name in names:
        (n_out, n_err, n_rc), (c_out, c_err, c_rc) = outputs[(name, "native")], outputs[(name, "cachalot")]
        native, other = _trails(n_out), _trails(c_out)
        row = {"config": name, "conf": CONFIGS[name], "ops": args.ops}
        if n_rc != 0 or c_rc != 0:
            row["error"] = f"native exit {n_rc}, cachalot exit {c_rc}: {(n_err or c_err)[-400:]}"
        programs, differ = compare(native, other)
        row.update({"programs": programs, "operations": sum(map(len, native.values())), "differ": len(differ),
                    "differing_seeds": differ[:50]})
        row["explained"] = _explain(name, CONFIGS[name], args, differ[: args.explain]) if differ else []
        rows.append(row)
    text = _markdown(rows, args, time.time() - started)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text)
    return 1 if any(r["differ"] or "error" in r or r["programs"] < args.programs for r in rows) else 0


def _markdown(rows, args, wall):
    lines = [
        f"Differential checker: {args.programs} programs of {args.ops} operations per configuration "
        f"(seeds {args.first}..{args.first + args.programs - 1}), {wall:.0f} s.",
        "",
        "| configuration | programs | operations | programs whose statistics differ | |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['config']} (`{r['conf'] or 'defaults'}`) | {r['programs']} | {r['operations']} "
                     f"| {r['differ']} | {r.get('error', '')} |")
    for r in rows:
        for line in r["explained"]:
            lines.append(f"- {r['config']}: {line}")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["native", "cachalot"], help=argparse.SUPPRESS)
    p.add_argument("--seeds", help=argparse.SUPPRESS)
    p.add_argument("--full", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--programs", type=int, default=5000, help="programs per configuration")
    p.add_argument("--first", type=int, default=0, help="first seed")
    p.add_argument("--ops", type=int, default=120, help="operations per program")
    p.add_argument("--explain", type=int, default=3, help="differing programs run again to name the keys")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args()
    if args.worker:
        args.allocator = args.worker
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())

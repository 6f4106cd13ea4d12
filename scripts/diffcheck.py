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
same programs one after the other, one under PyTorch's allocator and one under
cachalot (`CACHALOT_ALLOC_CONF=policy:pytorch,<conf>`); the driver compares
their hashes operation by operation and, for the first programs that differ,
runs them again to name the keys that differ, and at which operation.

MemPools are in the programs (created with each option, routed to as
`use_mem_pool` does, left, deleted), and so are CUDA graph captures (on a side
stream, into the graph's own pool or a `graph_pool_handle()` shared by the
graphs of the program, with allocations and frees on every stream during the
capture; graphs deleted later). A capture never spans a device
synchronization, an empty_cache or a deletion (each would break the capture).
Under expandable_segments the programs hold no MemPool and no capture:
PyTorch 2.11's private pools on expandable segments fail its own assert at an
empty_cache (`cudaMalloc_count > 0`), and crash when a graph dies before a
tensor captured into it (seen on an H100 with torch 2.11). No tensor used on another stream is freed while a MemPool or a capture is
routed to: PyTorch defers such a free's events to the first allocation after
the route, which records them and queries them at once, so whether they have
completed is a race on the GPU, not the allocator's logic (the unit tests and
the conformance suite cover those frees).

    python3 scripts/diffcheck.py --programs 5000 --ops 120 --json out.json --markdown out.md

The processes run one after another. With `--seconds S` each configuration's
PyTorch process gets an equal share of half of S and starts no program after
it (5000 programs per configuration take longer than a device call); the
cachalot process then runs the programs it finished, and the table says how
many that was.

With `--golden DIR` it records instead: PyTorch's own allocator runs
`--programs` programs per configuration, and DIR/pools.<configuration>.json.gz gets each program's
operations and memory_stats() after each, for `cachalot parity`.
"""

import argparse
import gzip
import hashlib
import json
import os
import random
import subprocess
import sys
import time
import warnings

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
MAX_GRAPHS = 2


class _Shape:
    """What a program has at a point: live tensors (and which were recorded
    on another stream), MemPools, graphs, and the open route if any."""

    def __init__(self):
        self.recorded = []
        self.captured = []  # per live tensor: the serial of the graph it was captured into, or None
        self.pools = 0
        self.graphs = []  # live graphs' serials, in creation order
        self.serial = 0
        self.route = None  # None, "pool" or ("capture", stream)
        self.private_pools = True


def program(seed, ops, single_record=False, private_pools=True):
    """`ops` operations: ("alloc", size, stream), ("free", k), ("record", k,
    stream), ("empty_cache",), ("reset_peak",); MemPool ones: ("pool_new",
    use_on_oom, no_split), ("pool_enter", j) (this thread's allocations go to
    pool j, as in `use_mem_pool`), ("pool_exit",), ("pool_del", j); graph
    ones: ("capture_begin", stream, shared) (into the graph's own pool, or the
    program's shared handle), ("capture_end",), ("graph_del", j). k indexes
    the live tensors in allocation order, j the live pools or graphs in
    creation order. With `single_record`, a tensor is recorded on one other
    stream at most; without `private_pools`, no MemPool nor graph is made."""
    rng = random.Random(seed)
    st, out = _Shape(), []
    st.private_pools = private_pools
    for _ in range(ops):
        op = _next_op(rng, st, single_record)
        _apply(st, op)
        out.append(op)
    return out


def _next_op(rng, st, single_record):
    capturing = isinstance(st.route, tuple)
    r = rng.random()
    if capturing and r < 0.12:
        return ("capture_end",)
    if r < 0.03:
        op = _pool_op(rng, st)
        if op is not None:
            return op
    if r < 0.05 and not capturing:
        op = _graph_op(rng, st)
        if op is not None:
            return op
    free_ok = [k for k, rec in enumerate(st.recorded) if not (st.route is not None and rec)]
    if free_ok and r < 0.40:
        return ("free", rng.choice(free_ok))
    if st.recorded and r < 0.50 and not capturing:
        k = rng.randrange(len(st.recorded))
        if not (single_record and st.recorded[k]):
            return ("record", k, rng.randrange(STREAMS))
    if r < 0.52 and not capturing:
        return ("empty_cache",)
    if r < 0.53:
        return ("reset_peak",)
    return ("alloc", _size(rng), rng.randrange(STREAMS))


def _apply(st, op):
    kind = op[0]
    if kind == "alloc":
        st.recorded.append(False)
        on_capture = isinstance(st.route, tuple) and st.route[1] == op[2]
        st.captured.append(st.graphs[-1] if on_capture else None)
    elif kind == "free":
        st.recorded.pop(op[1])
        st.captured.pop(op[1])
    elif kind == "record":
        st.recorded[op[1]] = True
    elif kind in ("pool_new", "pool_del"):
        st.pools += 1 if kind == "pool_new" else -1
    elif kind == "pool_enter":
        st.route = "pool"
    elif kind == "capture_begin":
        st.route = ("capture", op[1])
        st.serial += 1
        st.graphs.append(st.serial)
    elif kind in ("pool_exit", "capture_end"):
        st.route = None
    elif kind == "graph_del":
        st.graphs.pop(op[1])


def _pool_op(rng, st):
    """A MemPool operation that is valid now, or None. A pool is deleted only
    while no route is open (PyTorch 2.11 aborts otherwise)."""
    if st.route == "pool":
        return ("pool_exit",)
    if st.route is not None or not st.private_pools:
        return None
    choices = []
    if st.pools < MAX_POOLS:
        choices.append(("pool_new", rng.random() < 0.3, rng.random() < 0.3))
    if st.pools:
        choices.append(("pool_enter", rng.randrange(st.pools)))
        choices.append(("pool_del", rng.randrange(st.pools)))
    return rng.choice(choices) if choices else None


def _graph_op(rng, st):
    """A graph operation valid while no route is open, or None. A graph is
    deleted only once the tensors captured into it are gone: PyTorch 2.11
    under expandable_segments can erase the pool of a deleted graph at the
    next empty_cache while such a tensor lives, and then crashes (a
    segmentation fault) when that tensor is freed (seen on an H100)."""
    if st.route is not None or not st.private_pools:
        return None
    choices = []
    if len(st.graphs) < MAX_GRAPHS:
        choices.append(("capture_begin", rng.randrange(1, STREAMS), rng.random() < 0.5))
    done = [j for j, g in enumerate(st.graphs) if g not in st.captured]
    if done:
        choices.append(("graph_del", rng.choice(done)))
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


class _Runner:
    """Runs one program's operations on PyTorch, keeping what they made, and
    writes each as a golden operation (`golden`: ids for tensors, the real
    pool ids)."""

    def __init__(self, torch, streams):
        self.torch, self.streams = torch, streams
        self.device = torch.cuda.current_device()
        self.live, self.recorded, self.ids, self.next_id = [], [], [], 0
        self.pools, self.graphs = [], []
        self.routed = None  # a MemPool, or (graph, stream index)
        self.shared = None
        self.golden = []

    def step(self, op):
        getattr(self, "_" + op[0])(*op[1:])

    def _alloc(self, size, stream):
        with self.torch.cuda.stream(self.streams[stream]):
            self.live.append(self.torch.empty(size, dtype=self.torch.uint8, device="cuda"))
        self.recorded.append(False)
        self.ids.append(self.next_id)
        self.golden.append(["alloc", self.next_id, size, stream])
        self.next_id += 1

    def _free(self, k):
        del self.live[k]
        self.golden.append(["free", self.ids.pop(k)])
        if self.recorded.pop(k):
            self.torch.cuda.synchronize()

    def _record(self, k, stream):
        self.live[k].record_stream(self.streams[stream])
        self.recorded[k] = True
        self.golden.append(["record", self.ids[k], stream])

    def _empty_cache(self):
        self.torch.cuda.empty_cache()
        self.golden.append(["empty_cache"])

    def _reset_peak(self):
        self.torch.cuda.reset_peak_memory_stats()
        self.golden.append(["reset_peak"])

    def _pool_new(self, use_on_oom, no_split):
        pool = self.torch.cuda.MemPool(use_on_oom=use_on_oom, no_split=no_split)
        self.pools.append(pool)
        self.golden.append(["pool_new", *pool.id, int(use_on_oom), int(no_split)])

    def _pool_enter(self, j):
        self.routed = self.pools[j]
        self.torch._C._cuda_beginAllocateCurrentThreadToPool(self.device, self.routed.id)
        self.golden.append(["pool_enter", *self.routed.id])

    def _pool_exit(self):
        pid = self.routed.id
        self.torch._C._cuda_endAllocateToPool(self.device, pid)
        self.torch._C._cuda_releasePool(self.device, pid)
        self.routed = None
        self.golden.append(["pool_exit", *pid])

    def _pool_del(self, j):
        pid = self.pools[j].id
        del self.pools[j]
        self.golden.append(["pool_del", *pid])

    def _capture_begin(self, stream, shared):
        # The graph's own pool is named before the capture (a graph names its
        # internal one only after), which changes nothing in the allocator. A
        # shared handle whose graphs are all gone is not captured into again:
        # PyTorch 2.11 asserts on a pool with no use left.
        if self.shared is not None and not any(p == self.shared for _, p in self.graphs):
            self.shared = None
        if shared and self.shared is None:
            self.shared = self.torch.cuda.graph_pool_handle()
        pid = self.shared if shared else self.torch.cuda.graph_pool_handle()
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.stream(self.streams[stream]):
            graph.capture_begin(pool=pid, capture_error_mode="relaxed")
        self.graphs.append((graph, pid))
        self.routed = (graph, pid, stream)
        self.golden.append(["capture_begin", *pid, stream])

    def _capture_end(self):
        graph, pid, stream = self.routed
        with self.torch.cuda.stream(self.streams[stream]):
            graph.capture_end()
        self.routed = None
        self.golden.append(["capture_end", *pid])

    def _graph_del(self, j):
        pid = self.graphs[j][1]
        del self.graphs[j]
        self.golden.append(["graph_del", *pid])

    def close(self):
        if isinstance(self.routed, tuple):
            self._capture_end()
        elif self.routed is not None:
            self._pool_exit()
        self.live.clear()
        self.graphs.clear()
        self.pools.clear()
        self.shared = None


def run_program(torch, streams, ops, full, golden=None, verbose=False):
    """Runs one program; returns each operation's statistics hash (or, with
    `full`, the statistics themselves). The device is synchronized after each
    free of a tensor used on another stream (outside captures), so that its
    event has completed before the allocator next looks. `golden`, a list,
    receives the program's golden operations."""
    read = _stats_reader(torch, full)
    runner, trail = _Runner(torch, streams), []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*CUDA Graph is empty.*")
        for i, op in enumerate(ops):
            if verbose:
                print(f"operation {i}: {op}", file=sys.stderr, flush=True)
            runner.step(op)
            trail.append(read())
        if golden is not None:
            golden.extend(runner.golden)
        runner.close()
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
        if args.deadline is not None and time.time() > args.deadline:
            break
        ops = program(seed, args.ops, single_record=args.single_record, private_pools=not args.no_private_pools)
        golden = [] if args.golden_ops else None
        if args.verbose:
            print(f"seed {seed}", file=sys.stderr, flush=True)
        trail = run_program(torch, streams, ops, args.full, golden, args.verbose)
        line = {"seed": seed, "trail": trail}
        if golden is not None:
            line["ops"] = golden
        print(json.dumps(line), flush=True)
    if args.allocator == "cachalot":
        cachalot_torch.validate()


# ----------------------------------------------------------------------------
# Driver: both allocators per configuration, one after the other, then the comparison.
# ----------------------------------------------------------------------------


def _worker_cmd(allocator, args, conf, seeds=None, full=False, deadline=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", allocator, "--ops", str(args.ops)]
    if deadline is not None:
        cmd += ["--deadline", f"{deadline:.3f}"]
    if "expandable_segments:True" in conf:
        # PyTorch 2.11's private pools on expandable segments fail its own
        # assert at an empty_cache (cudaMalloc_count > 0): none there.
        cmd.append("--no-private-pools")
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


def ran_by_both(native, other):
    """The programs of `native` that `other` ran too (with a time budget, the
    cachalot process runs only those the native one finished)."""
    return {s: t for s, t in native.items() if s in other}


def compare(native, other, budgeted=False):
    """`(programs compared, [seeds that differ])`; with a time budget, only
    the programs both ran."""
    if budgeted:
        native, other = ran_by_both(native, other), ran_by_both(other, native)
    differ = [s for s in sorted(native) if native[s] != other.get(s)]
    differ += [s for s in sorted(other) if s not in native]
    return len(native), differ


def _explain(name, conf, args, seeds):
    """Runs differing programs again with the whole statistics."""
    out = []
    runs = {a: subprocess.run(_worker_cmd(a, args, conf, seeds, full=True) + ["--golden-ops"], env=_env(a, conf),
                              capture_output=True, text=True, check=False) for a in ("native", "cachalot")}  # fmt: skip
    full = {a: _trails(r.stdout) for a, r in runs.items()}
    if args.json:
        # PyTorch's statistics of the differing programs, as golden entries that
        # `cachalot parity` replays on the simulated device (to find the cause).
        lines = [json.loads(l) for l in runs["native"].stdout.splitlines() if l.startswith("{")]
        entries = [{"name": f"differs_{x['seed']}", "conf": conf, "ops": x["ops"], "after": x["trail"]}
                   for x in lines]  # fmt: skip
        path = os.path.join(os.path.dirname(os.path.abspath(args.json)), f"differing.{name}.json.gz")
        with gzip.open(path, "wt") as f:
            json.dump(entries, f)
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
        op = program(seed, args.ops, private_pools="expandable_segments:True" not in conf)[i] if i < args.ops else None
        shown = ", ".join(f"{k} {b[i].get(k)} vs {a[i].get(k)}" for k in keys[:6]) if i < min(len(a), len(b)) else ""
        out.append(f"seed {seed}: operation {i} {op}: {shown}")
    return out


def driver(args):
    names = args.configs.split(",")
    started = time.time()
    # One process at a time: with other processes on the GPU PyTorch's own
    # allocator once split a block otherwise than it does alone, and a
    # process once stalled at one program for the rest of its time (session
    # 25; not seen again in session 26, side by side from seed 0). A time
    # budget is shared out equally; the cachalot process runs the programs
    # the native one finished.
    share = args.seconds / (2 * len(names)) if args.seconds is not None else None
    outputs, budgeted = {}, share is not None
    for name in names:
        conf, env = CONFIGS[name], _env("native", CONFIGS[name])
        deadline = time.time() + share if budgeted else None
        run = subprocess.run(_worker_cmd("native", args, conf, deadline=deadline), env=env,
                             capture_output=True, text=True, check=False)  # fmt: skip
        outputs[(name, "native")] = (run.stdout, run.stderr, run.returncode)
        seeds = sorted(_trails(run.stdout)) if budgeted else None
        if budgeted and not seeds:
            outputs[(name, "cachalot")] = ("", "", 0)
            continue
        run = subprocess.run(_worker_cmd("cachalot", args, conf, seeds), env=_env("cachalot", conf),
                             capture_output=True, text=True, check=False)  # fmt: skip
        outputs[(name, "cachalot")] = (run.stdout, run.stderr, run.returncode)
    rows = []
    for name in names:
        (n_out, n_err, n_rc), (c_out, c_err, c_rc) = outputs[(name, "native")], outputs[(name, "cachalot")]
        native, other = _trails(n_out), _trails(c_out)
        row = {"config": name, "conf": CONFIGS[name], "ops": args.ops}
        if n_rc != 0 or c_rc != 0:
            row["error"] = f"native exit {n_rc}, cachalot exit {c_rc}: {(n_err or c_err)[-400:]}"
        programs, differ = compare(native, other, budgeted=budgeted)
        ran = ran_by_both(native, other) if budgeted else native
        row.update({"programs": programs, "operations": sum(map(len, ran.values())), "differ": len(differ),
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
    least = 1 if budgeted else args.programs
    return 1 if any(r["differ"] or "error" in r or r["programs"] < least for r in rows) else 0


def _markdown(rows, args, wall):
    lines = [
        f"Differential checker: {'up to ' if args.seconds is not None else ''}{args.programs} programs of "
        f"{args.ops} operations per configuration (seeds from {args.first}"
        f"{f', as many as {args.seconds:.0f} s shared out allowed' if args.seconds is not None else ''}), {wall:.0f} s.",
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


def record_golden(args):
    """Runs the programs on PyTorch's own allocator per configuration and
    writes DIR/pools.<configuration>.json.gz."""
    os.makedirs(args.golden, exist_ok=True)
    for name in args.configs.split(","):
        cmd = _worker_cmd("native", args, CONFIGS[name]) + ["--full", "--golden-ops"]
        cmd += ["--single-record"] if args.single_record else []
        run = subprocess.run(cmd, env=_env("native", CONFIGS[name]), capture_output=True, text=True, check=False)
        lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
        if run.returncode != 0 or len(lines) != args.programs:
            print(f"{name}: exit {run.returncode}, {len(lines)} programs: {run.stderr[-800:]}")
            return 1
        entries = [{"name": f"pools_{x['seed']}", "conf": CONFIGS[name], "ops": x["ops"], "after": x["trail"]}
                   for x in lines]  # fmt: skip
        path = os.path.join(args.golden, f"pools.{name}.json.gz")
        with gzip.open(path, "wt") as f:
            json.dump(entries, f)
        print(f"{path}: {len(entries)} programs, {sum(len(e['ops']) for e in entries)} operations")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", choices=["native", "cachalot"], help=argparse.SUPPRESS)
    p.add_argument("--seeds", help=argparse.SUPPRESS)
    p.add_argument("--full", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--golden-ops", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-private-pools", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    p.add_argument("--golden", metavar="DIR", help="record golden files for `cachalot parity` instead")
    p.add_argument("--single-record", action="store_true", help="record each tensor on one other stream at most")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--programs", type=int, default=5000, help="programs per configuration")
    p.add_argument("--first", type=int, default=0, help="first seed")
    p.add_argument("--seconds", type=float, help="a time budget, shared out over the configurations and allocators")
    p.add_argument("--ops", type=int, default=120, help="operations per program")
    p.add_argument("--explain", type=int, default=3, help="differing programs run again to name the keys")
    p.add_argument("--json")
    p.add_argument("--markdown")
    args = p.parse_args()
    if args.seconds is not None and not args.seconds > 0:
        p.error(f"--seconds must be positive, not {args.seconds}")
    if args.worker:
        args.allocator = args.worker
        worker(args)
        return 0
    return record_golden(args) if args.golden else driver(args)


if __name__ == "__main__":
    sys.exit(main())

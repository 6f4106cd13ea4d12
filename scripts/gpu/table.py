#!/usr/bin/env python3
"""Merges the GPU benchmark's JSON files in DIR (native.json from
native_bench.py, cachalot.json from the Rust gpu bench) into markdown tables.

The speed comparison is the one-process run of native_bench.py --plugin: all
the allocators in one process (RMM's pool, arena and async resources too where
the extension was built with RMM), taking turns, so a slow spell of the host
touches each alike; each ratio is the median of the turns' ratios, shown with
the middle half of them (a single turn can be hit by a pause of the host far
longer than a fast allocator's turn; every turn is in the JSON). Reserved
memory, the simulator's prediction and driver calls come from the Rust bench
(CudaBackend, its own process), whose own ns/op are listed apart; for the
allocators that it and native_bench.py's own replay do not run (RMM's), the
reserved memory is what the allocator reported in the one-process run.

Usage: table.py DIR
"""
import json
import os
import statistics
import sys

NAMES = {
    "pytorch": "PyTorch native",
    "pytorch:expandable": "PyTorch expandable_segments",
    "async": "cudaMallocAsync (kept pool)",
    "cachalot:pytorch": "cachalot, pytorch policy",
    "cachalot:cachalot": "cachalot, cachalot policy",
    "cachalot:cachalot+side": "cachalot, cachalot policy, a side stream holding a block",
    "rmm:pool": "RMM pool_memory_resource (from empty)",
    "rmm:arena": "RMM arena_memory_resource",
    "rmm:async": "RMM cuda_async_memory_resource",
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


def memory_rows(native, cachalot):
    """Per trace and allocator, the replay records of both processes."""
    rows = {}
    for run in (native, cachalot):
        for trace, by in run["replay"].items():
            rows.setdefault(trace, {}).update(by)
    return rows


def num(x, fmt):
    return "-" if x is None else format(x, fmt)


def speed_table(one, memory):
    keys = [k for k in NAMES if any(k in by for by in one["traces"].values())]
    cold = one.get("cold", 1)
    print(f"One process, the {len(keys)} allocators taking turns ({cold} first passes from an empty cache "
          f"each, in rounds, then {one['turns']} turns of one untimed and {one['timed']} timed passes each; "
          f"cachalot through its plug-in's C entry points):\n")
    print("| trace | allocator | ns/op first pass (median) | first pass / PyTorch native (median of rounds) "
          "| ns/op steady (median of turns) "
          "| / PyTorch native (median of turns) | middle half of turns | reserved MiB (allocator) "
          "| device used MiB (cuMemGetInfo) | simulator predicted MiB "
          "| driver memory calls: first pass / later pass |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failures = []
    for trace, by in sorted(one["traces"].items()):
        for key in keys:
            r = by.get(key)
            if not r:
                continue
            name = NAMES[key]
            if "failed" in r:
                failures.append(f"{trace}, {name}: {r['failed']} (after {len(r['turns'])} turns)")
                name += " (failed)"
            m = memory.get(trace, {}).get(key, {})
            reserved = m.get("reserved_after_first", r.get("reserved_after_first"))
            ratios = r.get("ratios", [])
            spread = "-"
            if len(ratios) >= 2:
                q1, _, q3 = statistics.quantiles(ratios, n=4)
                spread = f"{q1:.3f} - {q3:.3f}"
            print(f"| {trace} | {name} | {num(r.get('first'), '.0f')} | "
                  f"{num(r.get('first_ratio_median'), '.2f')} | {num(r.get('steady'), '.0f')} | "
                  f"{num(r.get('ratio_median'), '.3f')} | {spread} | "
                  f"{mib(reserved)} | {mib(m.get('device_used_after_first'))} | "
                  f"{mib(m.get('sim_reserved'))} | {calls(m)} |")
    if any(k.startswith("rmm:") for k in keys):
        print("\nRMM 26.10, each resource over cudaMalloc where it has an upstream: the pool starts empty and "
              "grows by at least its own size (reserved: the pool's size, which never shrinks); the arena "
              "takes its whole size from the device when it is made (1.5 times the op list's peak of live "
              "bytes, at least 1 GiB, at most half the free memory; reserved: that size); the async resource "
              "is cudaMallocAsync on a kept pool of its own (reserved: the pool's count). The arena frees "
              "blocks over 1 MiB after a cudaStreamSynchronize of their stream, by design; device used, "
              "where native_bench.py --contenders ran it, misses the arena, taken before the first pass.")
    for failure in failures:
        print(f"\nFAILED: {failure}")


def waste(memory, trace, key, peak):
    """Peak reserved over the op list's peak of requested bytes live."""
    reserved = memory.get(trace, {}).get(key, {}).get("reserved_peak")
    return f"{reserved / peak:.3f}" if reserved and peak else "-"


def lead_table(one, memory):
    """Per trace, the cachalot policy against PyTorch native and against the
    fastest of the other allocators (cachalot's own pytorch policy left out),
    from the one-process run, and its waste beside expandable segments'."""
    print("\nThe cachalot policy against its peers (from the table above; waste: peak reserved over the op "
          "list's peak of requested bytes live):\n")
    print("| trace | first pass / PyTorch native | steady / PyTorch native | fastest peer, steady ns/op "
          "| cachalot policy, steady ns/op | lead | waste, cachalot policy | waste, expandable_segments |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    peaks = one.get("peak_live", {})
    for trace, by in sorted(one["traces"].items()):
        ours = by.get("cachalot:cachalot", {})
        peers = [(r["steady"], NAMES.get(k, k)) for k, r in by.items()
                 if not k.startswith("cachalot:") and "steady" in r and "failed" not in r]
        if "steady" not in ours or not peers:
            continue
        fastest, name = min(peers)
        print(f"| {trace} | {num(ours.get('first_ratio_median'), '.2f')} | "
              f"{num(ours.get('ratio_median'), '.3f')} | {name} {fastest:.0f} | {ours['steady']:.0f} | "
              f"{fastest / ours['steady']:.1f}x | {waste(memory, trace, 'cachalot:cachalot', peaks.get(trace))} | "
              f"{waste(memory, trace, 'pytorch:expandable', peaks.get(trace))} |")


def rust_table(memory):
    print("\ncachalot through its Rust API (CudaBackend), its own process, for reference:\n")
    print("| trace | allocator | ns/op first pass | ns/op steady (median of passes 2..) "
          "| steady / one stream |")
    print("|---|---|---:|---:|---:|")
    for trace, by in sorted(memory.items()):
        alone = by.get("cachalot:cachalot", {}).get("ns_steady")
        for key in ("cachalot:pytorch", "cachalot:cachalot", "cachalot:cachalot+side"):
            r = by.get(key)
            if r:
                ratio = f"{r['ns_steady'] / alone:.2f}" if key.endswith("+side") and alone else "-"
                print(f"| {trace} | {NAMES[key]} | {r['ns_first']:.0f} | {r['ns_steady']:.0f} | {ratio} |")


def _rate(cell):
    """A thread count's ops per microsecond (cachalot's bench also gives the
    driver calls made while timed)."""
    return cell["ops_per_us"] if isinstance(cell, dict) else cell


def scaling_table(native, cachalot):
    gpu = {**native["scaling"], **cachalot["scaling"]}
    sim = cachalot.get("scaling_sim", {})
    rows = [(name, gpu[k]) for k, name in NAMES.items() if k in gpu]
    rows += [(name + ", simulated device", sim[k]) for k, name in NAMES.items() if k in sim]
    apart = cachalot.get("scaling_sim_apart")
    if apart:
        rows.append(("cachalot policy, an allocator per thread (nothing shared), simulated device", apart))
    print("\n| allocator | 1 thread | 2 threads | 4 threads | 8 threads | 8 / 1 | 8 / 1 by round | driver calls while timed (8 threads) |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, s in rows:
        cells = [f"{_rate(s[t]):.2f}" if t in s else "-" for t in ("1", "2", "4", "8")]
        ratio = f"{_rate(s['8']) / _rate(s['1']):.2f}" if "1" in s and "8" in s else "-"
        rounds = ", ".join(f"{r:.2f}" for r in s.get("ratios_8_1", [])) or "-"
        calls = s["8"].get("memory_calls", "-") if isinstance(s.get("8"), dict) else "-"
        print(f"| {name} | {' | '.join(cells)} | {ratio} | {rounds} | {calls} |")
    print("\n(ops per microsecond over all threads, each thread on its own stream; cachalot's rows:")
    print("a timed window per run, the thread counts taking turns over nine rounds, medians)")
    clock = cachalot.get("clock_read_ns")
    if clock is not None:
        print("\nA read of the clock the cachalot policy stamps each operation with while the device has")
        print(f"several streams (the time-stamp counter, through quanta) takes {clock:.1f} ns on this host.")


def main():
    d = sys.argv[1]
    native, cachalot = load(d, "native.json"), load(d, "cachalot.json")
    gpu_txt = os.path.join(d, "gpu.txt")
    gpu = open(gpu_txt).read().strip() if os.path.exists(gpu_txt) else "?"
    print(f"GPU: {gpu}\n")
    memory = memory_rows(native, cachalot)
    if "one_process" in native:
        speed_table(native["one_process"], memory)
        lead_table(native["one_process"], memory)
    else:
        print("(no one-process run: native_bench.py ran without --plugin)")
    rust_table(memory)
    scaling_table(native, cachalot)


if __name__ == "__main__":
    main()

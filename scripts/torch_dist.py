#!/usr/bin/env python3
"""Multi-GPU training on cachalot: torch.distributed, one process per GPU.

Three workloads, each rank on its own GPU with its own allocator:
  ddp-gpt2      GPT-2 (12 layers, 512 tokens; the benchmark's) under DistributedDataParallel, AdamW
  ddp-resnet50  torchvision resnet50 under DistributedDataParallel, SGD
  fsdp-llama    a Llama-style model (transformers LlamaConfig, bf16) sharded with
                FSDP2 (torch.distributed.fsdp.fully_shard), AdamW

each under four allocators, one torchrun launch per allocator (PyTorch's
allocator can only be swapped before first use), every rank running the three
workloads in turn:
  native       PyTorch's caching allocator, default settings
  expandable   PyTorch's, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cl-pytorch   cachalot, policy:pytorch (PyTorch's policy reproduced)
  cl-cachalot  cachalot, policy:cachalot
  cl-cachalot+KEY:VALUE,...  cachalot, policy:cachalot with those settings too
               (held to cl-cachalot's targets)

Launches run in rounds, the allocators' order turned by one each round. Every
process gets NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1 (NVLink multicast stays off).

Per rank, compared with native's same rank in the same round: the loss of every
step (same seeds, deterministic kernels: they must be equal),
torch.cuda.memory_stats() after every step (every key; for the pytorch policy),
the median step time and the first step's, peak reserved. After the last step
every rank hashes its parameters (FSDP: its shard, and the whole model gathered):
the ranks must agree with each other and with native's run (NCCL's collectives
read and write buffers from the allocator on side streams, so a block reused
too early would show here). The streams that hold segments at the end are
counted from torch.cuda.memory._snapshot().

    python3 scripts/torch_dist.py --nproc 2 --json out.json --markdown out.md
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "gpu")]
import torch_bench as bench  # noqa: E402  (the models, and the comparisons both scripts make)

MIB = 1 << 20
# NVLink multicast can put a shared host's GPUs out of service: off everywhere.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CONFIGS = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cl-pytorch": {"CACHALOT_ALLOC_CONF": "policy:pytorch"},
    "cl-cachalot": {"CACHALOT_ALLOC_CONF": "policy:cachalot"},
}
WORKLOADS = ["ddp-gpt2", "ddp-resnet50", "fsdp-llama"]


def _config_env(name):
    """The environment that selects allocator `name` (see the module docs)."""
    base, _, extra = name.partition("+")
    if base not in CONFIGS or (extra and base != "cl-cachalot"):
        raise SystemExit(f"unknown allocator {name!r}: one of {', '.join(CONFIGS)}, or cl-cachalot+KEY:VALUE,...")
    env = dict(CONFIGS[base])
    if extra:
        env["CACHALOT_ALLOC_CONF"] += "," + extra
    return env


# ----------------------------------------------------------------------------
# Rank: one allocator, every workload, on this process's GPU.
# ----------------------------------------------------------------------------


def _ddp(torch, device):
    return lambda model: torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])


def _gpt2(torch, args, rank, device):
    return bench._gpt2(torch, args, seed=100 + rank, wrap=_ddp(torch, device))


def _resnet50(torch, args, rank, device):
    return bench._resnet50(torch, args, seed=200 + rank, wrap=_ddp(torch, device))


def _llama(torch, args, rank, device):
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=args.llama_hidden,
        intermediate_size=args.llama_hidden * 11 // 4,
        num_hidden_layers=args.llama_layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=args.llama_seq,
    )
    with torch.device("cuda"):
        model = bench._eager(LlamaForCausalLM, config).to(torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = bench._tokens(torch, config.vocab_size, args.llama_batch, args.llama_seq, 300 + rank)
    return model, bench._lm_step(model, opt, tokens)


BUILDERS = {"ddp-gpt2": _gpt2, "ddp-resnet50": _resnet50, "fsdp-llama": _llama}


def _digest(tensors):
    """SHA-256 of the tensors' bytes, in order."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _parameters_check(torch, dist, model):
    """This rank's parameter digest (its shard under FSDP) and whether every rank
    holds the same whole model."""
    params = list(model.parameters())
    sharded = bool(params) and hasattr(params[0], "full_tensor")
    local = _digest(p.to_local() if sharded else p for p in params)
    whole = _digest(p.full_tensor() if sharded else p for p in params)
    wholes = [None] * dist.get_world_size()
    dist.all_gather_object(wholes, whole)
    return {"params_local": local, "params_whole": whole, "ranks_agree": len(set(wholes)) == 1}


def _streams(torch):
    """The streams that hold segments now (from the allocator's snapshot)."""
    try:
        return len({seg.get("stream") for seg in torch.cuda.memory._snapshot()["segments"]})
    except (RuntimeError, KeyError, AttributeError):
        return None


def _reset(torch):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()


def _run_workload(torch, dist, name, args, rank, device):
    import gc

    _reset(torch)
    free_before = torch.cuda.mem_get_info()[0]
    bench._seed(torch, 0)
    model, step = BUILDERS[name](torch, args, rank, device)
    losses, times, step_stats, min_free = [], [], [], torch.cuda.mem_get_info()[0]
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        min_free = min(min_free, torch.cuda.mem_get_info()[0])
        step_stats.append(torch.cuda.memory_stats())
    stats = torch.cuda.memory_stats()
    streams = _streams(torch)
    check = _parameters_check(torch, dist, model)
    del model, step, loss
    gc.collect()
    return {
        "losses": losses,
        "step_ms": [t * 1e3 for t in times[args.warmup :]],
        "step_ms_median": statistics.median(times[args.warmup :]) * 1e3,
        "first_step_ms": times[0] * 1e3,
        "step_stats": step_stats,
        "peak_reserved": stats["reserved_bytes.all.peak"],
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "device_peak_delta": free_before - min_free,
        "segment_streams": streams,
        **check,
    }


def rank_main(args):
    os.environ.update(SAFE_ENV)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.distributed as dist

    cachalot = None
    if args.config.startswith("cl-"):
        import cachalot_torch

        cachalot_torch.use()  # before anything touches CUDA
        cachalot = cachalot_torch
    device = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(device)
    tracing = args.trace and os.environ.get("RANK", "0") == "0"
    if tracing:  # from the first allocation on, so that the trace replays
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=20_000_000)
    launched = time.perf_counter()
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    dist.init_process_group("nccl", device_id=torch.device("cuda", device))
    rank = dist.get_rank()
    results = {"rank": rank, "device": device, "world": dist.get_world_size(), "workloads": {}}
    for name in args.workloads.split(","):
        started = time.perf_counter()
        results["workloads"][name] = _run_workload(torch, dist, name, args, rank, device)
        r = results["workloads"][name]
        print(f"# {args.config} rank {rank} {name}: {r['step_ms_median']:.2f} ms/step, first {r['first_step_ms']:.0f} ms, "
              f"peak reserved {r['peak_reserved'] / MIB:.0f} MiB, {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
    if cachalot is not None:
        cachalot.validate()
        results["cachalot_config"] = cachalot.config()
    if tracing:
        os.makedirs(args.trace, exist_ok=True)
        import record_traces

        name = f"{args.workloads.replace('-', '_').replace(',', '+')}_{results['world']}ranks"
        conf = _config_env(args.config).get("PYTORCH_CUDA_ALLOC_CONF", "")
        record_traces.write_recording(torch, os.path.join(args.trace, f"{name}.{args.config}"), name, args.config,
                                      conf, time.perf_counter() - launched, [])
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


# ----------------------------------------------------------------------------
# Driver: one torchrun launch per allocator and round, then the comparison.
# ----------------------------------------------------------------------------


def _passthrough(args):
    out = ["--trace", os.path.abspath(args.trace)] if args.trace else []
    for key in ("workloads", "steps", "warmup", "gpt2_batch", "gpt2_seq", "gpt2_layers", "resnet_batch",
                "llama_batch", "llama_seq", "llama_layers", "llama_hidden"):
        out += ["--" + key.replace("_", "-"), str(getattr(args, key))]
    return out


def _launch(name, args, out):
    """One torchrun launch; `{rank: results}` or `{"_error": ...}`."""
    env = dict(os.environ)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
        env.pop(key, None)
    env.update(SAFE_ENV)
    env.update(_config_env(name))
    env.setdefault("OMP_NUM_THREADS", "1")
    os.makedirs(out, exist_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
        os.path.abspath(__file__), "--rank-main", "--config", name, "--out", out,
    ] + _passthrough(args)  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    sys.stderr.write("\n".join(line for line in proc.stderr.splitlines() if line.startswith("# ")) + "\n")
    ranks = {}
    for r in range(args.nproc):
        path = os.path.join(out, f"rank{r}.json")
        if os.path.exists(path):
            with open(path) as f:
                ranks[r] = json.load(f)
    if proc.returncode != 0 or len(ranks) != args.nproc:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        return {"_error": f"exit {proc.returncode}: {proc.stderr[-600:]}"}
    print(f"# {name}: torchrun {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return ranks


def _per_step(step_stats, key):
    """How much `key` grew per step over the timed steps (the last half)."""
    half = len(step_stats) // 2
    return (step_stats[-1].get(key, 0) - step_stats[half - 1].get(key, 0)) / max(len(step_stats) - half, 1)


def _reproducible_equal(natives, runs, ranks):
    """`[equal, checkable]`: of the (rank, step) pairs where every native run
    gives the same statistics (PyTorch's own are reproducible there), those
    where every run of this allocator gives them too."""
    equal = checkable = 0
    for r in ranks:
        for i, want in enumerate(natives[0][r]["step_stats"]):
            if any(n[r]["step_stats"][i] != want for n in natives[1:]):
                continue
            checkable += 1
            equal += all(run[r]["step_stats"][i] == want for run in runs)
    return [equal, checkable]


def _row(workload, config, runs, natives):
    """`runs[round][rank]` of one workload and allocator against native's."""
    ranks = sorted(runs[0])
    per = lambda key, pick=max: [pick(run[r][key] for run in runs) for r in ranks]  # noqa: E731
    step = [max(run[r]["step_ms_median"] for r in ranks) for run in runs]  # the slowest rank sets the pace
    first = [max(run[r]["first_step_ms"] for r in ranks) for run in runs]
    row = {
        "workload": workload,
        "config": config,
        "rounds": len(runs),
        "step_ms_rounds": step,
        "step_ms_median": statistics.median(step),
        "first_step_ms": statistics.median(first),
        "peak_reserved": per("peak_reserved"),
        "peak_allocated": per("peak_allocated"),
        "device_peak_delta": per("device_peak_delta"),
        "segment_streams": per("segment_streams", lambda xs: max((x or 0) for x in xs)),
        "ranks_agree": all(run[r]["ranks_agree"] for run in runs for r in ranks),
        # Driver calls in steady state: device allocations per timed step, per rank.
        "device_allocs_per_step": per("step_stats", lambda xs: max(_per_step(x, "num_device_alloc") for x in xs)),
    }
    if natives:
        n_step = [max(n[r]["step_ms_median"] for r in ranks) for n in natives]
        ratios = [a / b for a, b in zip(step, n_step)]
        row["step_vs_native_rounds_pct"] = [100.0 * (x - 1.0) for x in ratios]
        row["step_vs_native_pct"] = 100.0 * (statistics.median(ratios) - 1.0)
        row["first_step_native_ms"] = statistics.median(max(n[r]["first_step_ms"] for r in ranks) for n in natives)
        row["max_abs_loss_diff"] = max(
            abs(a - b) for run, n in zip(runs, natives) for r in ranks for a, b in zip(n[r]["losses"], run[r]["losses"])
        )
        row["params_equal_native"] = all(
            run[r]["params_local"] == n[r]["params_local"] for run, n in zip(runs, natives) for r in ranks
        )
        counts = [bench._equal_steps(n[r]["step_stats"], run[r]["step_stats"], 8) for run, n in zip(runs, natives) for r in ranks]
        row["stats_steps_equal"] = [sum(c[0] for c in counts), sum(c[1] for c in counts)]
        row["stats_first_difference"] = next((c[2] for c in counts if c[2]), None)
        if config == "native" and len(natives) > 1:
            # PyTorch against itself: frees that wait on other streams' events
            # make the statistics depend on timing.
            self_counts = [bench._equal_steps(natives[0][r]["step_stats"], n[r]["step_stats"], 8) for n in natives[1:] for r in ranks]
            row["stats_steps_equal"] = [sum(c[0] for c in self_counts), sum(c[1] for c in self_counts)]
            row["stats_first_difference"] = next((c[2] for c in self_counts if c[2]), None)
        row["stats_reproducible_equal"] = _reproducible_equal(natives, runs, ranks)
    return row


def _compare(rounds, configs, workloads):
    rows = []
    for workload in workloads:
        natives = [r["native"] for r in rounds if "_error" not in r.get("native", {"_error": 1})]
        natives = [{k: v["workloads"][workload] for k, v in n.items()} for n in natives] if len(natives) == len(rounds) else []
        for config in configs:
            failed = [r[config]["_error"] for r in rounds if "_error" in r[config]]
            if failed:
                rows.append({"workload": workload, "config": config, "error": failed[0][:300]})
                continue
            runs = [{k: v["workloads"][workload] for k, v in r[config].items()} for r in rounds]
            rows.append(_row(workload, config, runs, natives))
    return rows


def _verdicts(rows):
    """The issue's targets, row by row: `{(workload, config): [failed target, ...]}`."""
    by_key = {(r["workload"], r["config"]): r for r in rows if "error" not in r}
    out = {}
    for (workload, config), r in by_key.items():
        misses = []
        if config == "native":
            continue
        if r.get("max_abs_loss_diff", 1.0) != 0.0:
            misses.append("losses differ from native")
        if not r["ranks_agree"] or not r.get("params_equal_native", False):
            misses.append("parameters differ")
        if config.startswith("cl-") and r.get("step_vs_native_pct", 100.0) > 2.0:
            misses.append("step time > native + 2%")
        if config == "cl-pytorch":
            equal, checkable = r.get("stats_reproducible_equal", [0, 0])
            if equal != checkable or checkable == 0:
                misses.append("memory_stats differ from native's where native's are reproducible")
        exp = by_key.get((workload, "expandable"))
        if config.startswith("cl-cachalot") and exp is None:
            misses.append("no expandable_segments run to compare peak reserved with")
        elif config.startswith("cl-cachalot") and not all(a < b for a, b in zip(r["peak_reserved"], exp["peak_reserved"])):
            misses.append("peak reserved not below expandable_segments'")
        out[(workload, config)] = misses
    return out


def _environment(nproc):
    """The machine, read without touching CUDA here (the ranks own the GPUs)."""
    import torch

    try:
        gpus = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=False,
        ).stdout.strip().splitlines()  # fmt: skip
        name, memory, driver = (x.strip() for x in gpus[0].split(","))
    except (OSError, IndexError, ValueError):
        gpus, name, memory, driver = [], "unknown", "0", "unknown"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": f"{len(gpus)} x {name}",
        "gpu_memory": int(memory) * MIB,
        "nproc": nproc,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def _mib(values):
    return " / ".join(f"{v / MIB:.0f}" for v in values)


def _markdown(env, rows, verdicts, command):
    lines = [
        f"Date {env['date']}; {env['gpu']} ({env['gpu_memory'] / 2**30:.0f} GiB each), {env['nproc']} ranks, "
        f"driver {env['driver']}, PyTorch {env['torch']} (CUDA {env['cuda']}), Python {env['python']}.",
        "",
        f"Command: `{command}`",
        "",
        "| workload | allocator | step ms | vs native (each round) | first step ms (native) "
        "| peak reserved MiB, per rank | device allocs per step | stats = native's (steps; where native's reproduce) | loss diff "
        "| params: ranks agree, = native | streams with segments | targets |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['config']} | error: {r['error']} | | | | | | | | | |")
            continue
        rounds = " ".join(f"{x:+.1f}%" for x in r.get("step_vs_native_rounds_pct", []))
        equal, repro = r.get("stats_steps_equal"), r.get("stats_reproducible_equal")
        misses = verdicts.get((r["workload"], r["config"]))
        lines.append(
            f"| {r['workload']} | {r['config']} | {r['step_ms_median']:.2f} | {r.get('step_vs_native_pct', 0.0):+.2f}% ({rounds}) "
            f"| {r['first_step_ms']:.0f} ({r.get('first_step_native_ms', r['first_step_ms']):.0f}) | {_mib(r['peak_reserved'])} "
            f"| {' / '.join(f'{x:g}' for x in r['device_allocs_per_step'])} "
            f"| {f'{equal[0]}/{equal[1]}' if equal else '-'}{f' ({repro[0]}/{repro[1]})' if repro and r['config'] != 'native' else ''} "
            f"| {r.get('max_abs_loss_diff', 0.0):.3g} "
            f"| {'yes' if r['ranks_agree'] else 'NO'}, {'yes' if r.get('params_equal_native', True) else 'NO'} "
            f"| {' / '.join(str(s) for s in r['segment_streams'])} "
            f"| {'-' if misses is None else ('met' if not misses else 'MISSED: ' + '; '.join(misses))} |"
        )
    notes = [f"- {r['workload']} {r['config']}: first memory_stats difference, {r['stats_first_difference']}"
             for r in rows if r.get("stats_first_difference") and r["config"] in ("native", "cl-pytorch")]
    if notes:
        lines += ["", "Statistics (the native rows compare native's later rounds with its first):", *notes]
    return "\n".join(lines) + "\n"


def _without_step_stats(rounds):
    """The rounds' results for the JSON, less every step's memory_stats."""

    def rank(res):
        return {**res, "workloads": {w: {k: v for k, v in x.items() if k != "step_stats"} for w, x in res["workloads"].items()}}

    return [
        {c: launch if "_error" in launch else {r: rank(res) for r, res in launch.items()} for c, launch in rnd.items()}
        for rnd in rounds
    ]


def _report(args, env, rounds, configs, workloads):
    """The table from the rounds so far (written after every round, so that a
    run cut short still leaves what it measured); returns it and the verdicts."""
    rows = _compare(rounds, configs, workloads)
    verdicts = _verdicts(rows)
    command = "python3 " + " ".join([os.path.relpath(os.path.abspath(__file__))] + sys.argv[1:])
    text = _markdown(env, rows, verdicts, command)
    if len(rounds) < args.rounds:
        text += f"\n(after {len(rounds)} of {args.rounds} rounds)\n"
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows, "rounds": _without_step_stats(rounds)}, f)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return text, rows, verdicts


def driver(args):
    bench._pin_cpus(args.cpus)
    configs = args.configs.split(";") if ";" in args.configs else args.configs.split(",")
    for name in configs:
        _config_env(name)  # refuses an unknown one before anything runs
    if "native" not in configs:
        configs.insert(0, "native")
    workloads = args.workloads.split(",")
    env, rounds = _environment(args.nproc), []
    with tempfile.TemporaryDirectory(prefix="torch-dist-") as tmp:
        for k in range(args.rounds):
            order = configs[k % len(configs) :] + configs[: k % len(configs)]
            results = {}
            for name in order:
                print(f"== round {k + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
                results[name] = _launch(name, args, os.path.join(tmp, f"{k}-{name}"))
            rounds.append(results)
            text, rows, verdicts = _report(args, env, rounds, configs, workloads)
    print(text)
    failed = [r for r in rows if "error" in r] + [k for k, v in verdicts.items() if v]
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--nproc", type=int, default=2, help="processes, one per GPU")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="allocators to run, split by ',' (by ';' where one has settings); native always runs")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--rounds", type=int, default=2, help="launches per allocator, taking turns")
    p.add_argument("--cpus", type=int, default=16, help="run the ranks on this many cores (0: all)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per workload")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--gpt2-batch", type=int, default=8)
    p.add_argument("--gpt2-seq", type=int, default=512)
    p.add_argument("--gpt2-layers", type=int, default=12)
    p.add_argument("--resnet-batch", type=int, default=64)
    p.add_argument("--llama-batch", type=int, default=4)
    p.add_argument("--llama-seq", type=int, default=2048)
    p.add_argument("--llama-layers", type=int, default=16)
    p.add_argument("--llama-hidden", type=int, default=2048)
    p.add_argument("--trace", help="rank 0 records its allocator trace (the whole launch: name one workload) "
                   "into this folder, as record_traces.py does; recording slows the step")
    p.add_argument("--json", help="write every number here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args()
    return rank_main(args) if args.rank_main else driver(args)


if __name__ == "__main__":
    sys.exit(main())

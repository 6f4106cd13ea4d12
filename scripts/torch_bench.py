#!/usr/bin/env python3
"""Real PyTorch models on cachalot, against PyTorch's own allocator.

Runs, on one GPU, in one go:
  * resnet50 training (torchvision, random images, SGD),
  * GPT-2 training (transformers GPT2LMHeadModel from a GPT2Config, random tokens, AdamW),
  * BERT inference with a different sequence length at every step,
each under four allocators, each allocator in its own process (PyTorch's
allocator can only be swapped before first use):
  native       PyTorch's caching allocator, default settings
  expandable   PyTorch's, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cl-pytorch   cachalot, policy:pytorch (PyTorch's policy reproduced)
  cl-cachalot  cachalot, policy:cachalot

The processes run in rounds, one process per allocator in each round, the order
turned by one place each round, so that a slow spell of the shared machine hits
every allocator alike. Step time is the median over the timed steps of a process,
after warm-up; "vs native" is the median over rounds of that round's ratio to
native's, and the table's step time the median over rounds.

Same seeds and deterministic flags in every process, so each step's loss must
match native's; the report gives the largest difference over all rounds, and
counts the steps (all rounds) after which cachalot's pytorch policy gives
native's torch.cuda.memory_stats(), key for key. Peak reserved is read two ways: the
allocator's own statistics (reserved_bytes.all.peak) and the device's free
memory (cudaMemGetInfo) sampled at every step boundary, as a drop from the
level before the model was built.

    python3 scripts/torch_bench.py \
        --json out.json --markdown out.md
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20

CONFIGS = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cl-pytorch": {"CACHALOT_ALLOC_CONF": "policy:pytorch"},
    "cl-cachalot": {"CACHALOT_ALLOC_CONF": "policy:cachalot"},
}
MODELS = ["resnet50", "gpt2", "bert"]


# ----------------------------------------------------------------------------
# Worker: one allocator, every model, in this process.
# ----------------------------------------------------------------------------


def _seed(torch, seed):
    import random

    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


class Memory:
    """Reads memory the same way whichever allocator is installed."""

    def __init__(self, torch, cachalot):
        self.torch = torch
        self.cachalot = cachalot

    def stats(self):
        return self.torch.cuda.memory_stats()

    def reset(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()
        self.torch.cuda.reset_peak_memory_stats()
        self.torch.cuda.reset_accumulated_memory_stats()

    def free_bytes(self):
        return self.torch.cuda.mem_get_info()[0]


def _eager(cls, config):
    """The model with plain (deterministic) attention where transformers allows it."""
    try:
        return cls._from_config(config, attn_implementation="eager")
    except (TypeError, ValueError, AttributeError):
        return cls(config)


def _same(model):
    return model


def _resnet50(torch, args, seed=1, wrap=_same):
    """resnet50 training with SGD on two random batches; `wrap` (DDP in
    torch_dist.py) takes the model before its optimizer is made."""
    import torchvision

    with torch.device("cuda"):  # initialised on the GPU: seconds less per process
        model = torchvision.models.resnet50(weights=None)
    model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cpu").manual_seed(seed)
    batches = [
        (
            torch.randn(args.resnet_batch, 3, 224, 224, generator=g).cuda(),
            torch.randint(0, 1000, (args.resnet_batch,), generator=g).cuda(),
        )
        for _ in range(2)
    ]
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def _tokens(torch, vocab, batch, seq, seed):
    """Two batches of random tokens, on the GPU."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randint(0, vocab, (batch, seq), generator=g).cuda() for _ in range(2)]


def _lm_step(model, opt, tokens):
    """A language model's training step `i`, on `tokens[i % len(tokens)]`."""

    def step(i):
        ids = tokens[i % len(tokens)]
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    return step


def _gpt2(torch, args, seed=2, wrap=_same):
    """GPT-2 training with AdamW; `wrap` as for resnet50."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=args.gpt2_layers, n_positions=args.gpt2_seq)
    with torch.device("cuda"):
        model = _eager(GPT2LMHeadModel, config)
    model.train()
    model = wrap(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = _tokens(torch, config.vocab_size, args.gpt2_batch, args.gpt2_seq, seed)
    return model, _lm_step(model, opt, tokens)


def _bert(torch, args):
    import random

    from transformers import BertConfig, BertModel

    config = BertConfig()
    with torch.device("cuda"):
        model = _eager(BertModel, config).eval()
    rng = random.Random(3)
    lengths = [rng.randint(16, 512) for _ in range(args.warmup + args.steps)]
    g = torch.Generator(device="cpu").manual_seed(3)
    inputs = [torch.randint(0, config.vocab_size, (args.bert_batch, n), generator=g) for n in lengths]
    # The check value projects every output on a fixed random direction, so any
    # changed element changes it.
    probe = torch.randn(config.hidden_size, generator=g).cuda()

    def step(i):
        with torch.no_grad():
            out = model(input_ids=inputs[i].cuda()).last_hidden_state
            return (out.float() @ probe).mean()

    return model, step


BUILDERS = {"resnet50": _resnet50, "gpt2": _gpt2, "bert": _bert}


def _run_model(torch, memory, name, args):
    import gc

    started = time.perf_counter()
    memory.reset()
    free_before = memory.free_bytes()
    _seed(torch, 0)
    model, step = BUILDERS[name](torch, args)
    losses, times, min_free, step_stats = [], [], memory.free_bytes(), []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(i)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        min_free = min(min_free, memory.free_bytes())
        step_stats.append(memory.stats())
    stats = memory.stats()
    del model, step, loss
    gc.collect()
    timed = times[args.warmup :]
    return {
        "losses": losses,
        "step_ms_median": statistics.median(timed) * 1e3,
        "step_ms_all": [t * 1e3 for t in timed],
        "first_step_ms": times[0] * 1e3,
        "step_stats": step_stats,
        "peak_reserved": stats["reserved_bytes.all.peak"],
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "peak_requested": stats.get("requested_bytes.all.peak", 0),
        "device_allocs": stats.get("num_device_alloc", 0),
        "segments_peak": stats["segment.all.peak"],
        "device_peak_delta": free_before - min_free,
        "wall_s": time.perf_counter() - started,
    }


def worker(args):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    started = time.perf_counter()
    import torch

    cachalot = None
    if args.worker.startswith("cl-"):
        import cachalot_torch

        cachalot_torch.use()
        cachalot = cachalot_torch
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.cuda.init()
    memory = Memory(torch, cachalot)
    print(f"# {args.worker}: torch ready in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    results = {}
    for name in args.models.split(","):
        results[name] = _run_model(torch, memory, name, args)
        print(f"# {args.worker} {name}: {results[name]['step_ms_median']:.2f} ms/step, {results[name]['wall_s']:.1f} s",
              file=sys.stderr, flush=True)
    if cachalot is not None:
        cachalot.validate()
        results["_config"] = cachalot.config()
    print("RESULT " + json.dumps(results), flush=True)


# ----------------------------------------------------------------------------
# Driver: one process per allocator, then the comparison.
# ----------------------------------------------------------------------------


def _environment():
    import torch

    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        driver = "unknown"
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "gpu": props.name,
        "gpu_memory": props.total_memory,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def _run_config(name, args):
    env = dict(os.environ)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
        env.pop(key, None)
    env.update(CONFIGS[name])
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name] + _passthrough(args)
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    sys.stderr.write(proc.stderr[-4000:])
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            result["_wall_s"] = time.time() - t0
            print(f"# {name}: process {result['_wall_s']:.1f} s", file=sys.stderr, flush=True)
            return result
    return {"_error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}


def _passthrough(args):
    out = []
    for key in ("models", "steps", "warmup", "resnet_batch", "gpt2_batch", "gpt2_seq", "gpt2_layers", "bert_batch"):
        value = getattr(args, key)
        if value is not None:
            out += ["--" + key.replace("_", "-"), str(value)]
    return out


def _compare(rounds):
    """One row per model and allocator from every round's results."""
    rows = []
    for model in MODELS:
        natives = [r.get("native", {}).get(model) for r in rounds]
        for config in CONFIGS:
            runs = [r.get(config, {}).get(model) for r in rounds]
            if any(run is None for run in runs):
                err = next((r.get(config, {}).get("_error") for r in rounds if r.get(config, {}).get("_error")), "not run")
                rows.append({"model": model, "config": config, "error": err[:200]})
                continue
            rows.append(_row(model, config, runs, natives))
    return rows


def _row(model, config, runs, natives):
    """The table's row: times are medians over rounds, memory the largest over
    rounds (they agree on the pytorch policy), losses and statistics compared
    round by round with native's."""
    skip = ("losses", "step_ms_all", "step_stats")
    row = {"model": model, "config": config, **{k: v for k, v in runs[0].items() if k not in skip}}
    row["rounds"] = len(runs)
    row["step_ms_rounds"] = [run["step_ms_median"] for run in runs]
    row["step_ms_median"] = statistics.median(row["step_ms_rounds"])
    row["first_step_ms"] = statistics.median(run["first_step_ms"] for run in runs)
    for key in ("peak_reserved", "peak_allocated", "peak_requested", "device_allocs", "segments_peak", "device_peak_delta"):
        row[key] = max(run[key] for run in runs)
    if all(n is not None for n in natives):
        ratios = [run["step_ms_median"] / n["step_ms_median"] for run, n in zip(runs, natives)]
        row["step_vs_native_rounds_pct"] = [100.0 * (x - 1.0) for x in ratios]
        row["step_vs_native_pct"] = 100.0 * (statistics.median(ratios) - 1.0)
        row["first_step_native_ms"] = statistics.median(n["first_step_ms"] for n in natives)
        row["max_abs_loss_diff"] = max(
            abs(a - b) for run, n in zip(runs, natives) for a, b in zip(n["losses"], run["losses"])
        )
        counts = [_equal_steps(n["step_stats"], run["step_stats"]) for run, n in zip(runs, natives)]
        row["stats_steps_equal"] = [
            sum(c[0] for c in counts),
            sum(c[1] for c in counts),
            next((c[2] for c in counts if c[2]), None),
        ]
    return row


def _equal_steps(native, other, shown=4):
    """`(equal, total, first difference)`: after how many training steps every
    `torch.cuda.memory_stats()` key equals native's, values included (the
    first difference names up to `shown` keys)."""
    equal, first = 0, None
    for i, (a, b) in enumerate(zip(native, other)):
        differ = sorted(k for k in a if a[k] != b.get(k))
        if differ:
            first = first or f"step {i}: " + ", ".join(f"{k} {b.get(k)} vs {a[k]}" for k in differ[:shown])
        else:
            equal += 1
    return [equal, len(native), first]


def _markdown(env, rows, command):
    lines = [
        f"Date {env['date']}; GPU {env['gpu']} ({env['gpu_memory'] / 2**30:.0f} GiB), driver {env['driver']}, "
        f"PyTorch {env['torch']} (CUDA {env['cuda']}), Python {env['python']}.",
        "",
        f"Command: `{command}`",
        "",
        "| model | allocator | step ms (median of rounds) | vs native (median of rounds) | vs native, each round "
        "| first step ms | peak reserved (allocator) | peak reserved (cudaMemGetInfo) | peak allocated "
        "| reserved / requested | device allocs | max abs loss diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['config']} | error: {r['error']} | | | | | | | | | |")
            continue
        ratio = r["peak_reserved"] / r["peak_requested"] if r.get("peak_requested") else float("nan")
        lines.append(
            f"| {r['model']} | {r['config']} | {r['step_ms_median']:.2f} | {r.get('step_vs_native_pct', 0.0):+.2f}% "
            f"| {' '.join(f'{x:+.1f}%' for x in r.get('step_vs_native_rounds_pct', []))} | {r['first_step_ms']:.1f} | {r['peak_reserved'] / MIB:.0f} MiB | {r['device_peak_delta'] / MIB:.0f} MiB "
            f"| {r['peak_allocated'] / MIB:.0f} MiB | {ratio:.3f} | {r['device_allocs']} "
            f"| {r.get('max_abs_loss_diff', 0.0):.3g} |"
        )
    by_key = {(r["model"], r["config"]): r for r in rows if "error" not in r}
    lines.append("")
    for model in MODELS:
        a, b = by_key.get((model, "native")), by_key.get((model, "cl-pytorch"))
        if a and b:
            keys = ("peak_reserved", "peak_allocated", "peak_requested", "device_allocs", "segments_peak")
            differ = [f"{k} {b[k]} vs {a[k]}" for k in keys if a[k] != b[k]]
            equal, total, first = b.get("stats_steps_equal", [0, 0, "not compared"])
            lines.append(
                f"- {model}: torch.cuda.memory_stats() under cachalot's pytorch policy equals native's, every key, "
                f"after {equal} of {total} steps" + (f" (first difference: {first})." if first else ".")
            )
            lines.append(
                f"- {model}: cachalot's pytorch policy vs PyTorch native: peak reserved {b['peak_reserved']} vs "
                f"{a['peak_reserved']} bytes, device allocations {b['device_allocs']} vs {a['device_allocs']}, "
                f"peak segments {b['segments_peak']} vs {a['segments_peak']}: "
                + ("identical." if not differ else "differs in " + ", ".join(differ) + ".")
            )
    return "\n".join(lines) + "\n"


def _pin_cpus(count):
    """Every worker on the same few cores, so that none is luckier in where the
    scheduler puts it (the GPU's work is launched from one thread)."""
    cores = sorted(os.sched_getaffinity(0))
    if count and len(cores) > count:
        os.sched_setaffinity(0, cores[:count])
        print(f"# workers on cores {cores[:count]}", file=sys.stderr, flush=True)


def driver(args):
    _pin_cpus(args.cpus)
    configs = args.configs.split(",")
    if "native" not in configs:
        configs.insert(0, "native")
    rounds = []
    for k in range(args.rounds):
        order = configs[k % len(configs) :] + configs[: k % len(configs)]
        results = {}
        for name in order:
            print(f"== round {k + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            results[name] = _run_config(name, args)
        rounds.append(results)
    env = _environment()
    rows = _compare(rounds)
    command = "python3 " + " ".join([os.path.relpath(os.path.abspath(__file__))] + sys.argv[1:])
    text = _markdown(env, rows, command)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows, "rounds": rounds}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    failed = [r for r in rows if "error" in r]
    return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--configs", default=",".join(CONFIGS), help="allocators to run (native always runs)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rounds", type=int, default=3, help="processes per allocator, taking turns")
    p.add_argument("--cpus", type=int, default=4, help="run the workers on this many cores (0: all)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per model")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--resnet-batch", type=int, default=64)
    p.add_argument("--gpt2-batch", type=int, default=8)
    p.add_argument("--gpt2-seq", type=int, default=512)
    p.add_argument("--gpt2-layers", type=int, default=12)
    p.add_argument("--bert-batch", type=int, default=32)
    p.add_argument("--json", help="write every number here")
    p.add_argument("--markdown", help="write the table here")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`cachalot tune` proven on the GPU: for each model of the model benchmark
(scripts/torch_bench.py: resnet50 and GPT-2 training, BERT inference),

  1. run it on PyTorch's own allocator with its memory history recorded from
     the first allocation, and dump the snapshot;
  2. run `cachalot tune` on the snapshot (the GPU's capacity);
  3. run the model again on PyTorch's own allocator with the best setting for
     it (`PYTORCH_CUDA_ALLOC_CONF`), and, when cachalot's own policy is the
     recommendation, once more on cachalot_torch with it (`CACHALOT_ALLOC_CONF`).

The measured peak reserved bytes (torch.cuda.memory_stats) must equal the
prediction, to the byte, and be lower than the default's. Only memory is
measured, so the processes of a step run side by side.

    python3 scripts/tune_proof.py --cachalot target/release/cachalot --out DIR
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20


def worker(args):
    """One model on one allocator; prints RESULT {peak_reserved, ...}."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    sys.path.insert(0, HERE)
    import torch_bench

    if args.cachalot_torch:
        import cachalot_torch

        cachalot_torch.use()
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.record:
        torch.cuda.memory._record_memory_history(max_entries=10_000_000, context=None, stacks="python")
    torch_bench._seed(torch, 0)
    _, step = torch_bench.BUILDERS[args.worker](torch, args)
    losses = []
    for i in range(args.warmup + args.steps):
        losses.append(step(i).item())
    torch.cuda.synchronize()
    if args.record:
        torch.cuda.memory._dump_snapshot(args.record)
    stats = torch.cuda.memory_stats()
    print("RESULT " + json.dumps({"peak_reserved": stats["reserved_bytes.all.peak"], "losses": losses}), flush=True)


def _spawn(model, args, env_extra, record=None, python=None, cachalot_torch=False):
    env = dict(os.environ)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
        env.pop(key, None)
    env.update(env_extra)
    cmd = [python or sys.executable, os.path.abspath(__file__), "--worker", model,
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if record:
        cmd += ["--record", record]
    if cachalot_torch:
        cmd += ["--cachalot-torch"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc, what):
    """The worker's RESULT, or {"error": ...} (printed) when it failed."""
    out, err = proc.communicate()
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"FAILED: {what}: exit {proc.returncode}: {err[-3000:]}", flush=True)
    return {"error": f"exit {proc.returncode}", "peak_reserved": -1, "losses": []}


def _tune(args, snapshot, capacity):
    cmd = [args.cachalot, "tune", snapshot, "--capacity", str(capacity), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: {done.stderr}")
    report = json.loads(done.stdout)
    default = next(c for c in report["candidates"] if c["conf"] == "")
    return report, default


def driver(args):
    import torch

    capacity = torch.cuda.get_device_properties(0).total_memory
    os.makedirs(args.out, exist_ok=True)
    models = args.models.split(",")
    # 1. Record each model on PyTorch's default allocator.
    snapshots = {m: os.path.join(args.out, f"{m}.snapshot.pickle") for m in models}
    recorded = {m: _spawn(m, args, {}, record=snapshots[m]) for m in models}
    recorded = {m: _result(p, f"{m} recorded") for m, p in recorded.items()}
    # 2. Tune each snapshot.
    tuned = {m: _tune(args, snapshots[m], capacity) for m in models}
    # 3. The best settings, measured.
    runs = {}
    for m in models:
        report, _ = tuned[m]
        runs[m, "pytorch"] = _spawn(m, args, {"PYTORCH_CUDA_ALLOC_CONF": report["best_pytorch"]["value"]})
        best = report["recommended"]
        if best["variable"] == "CACHALOT_ALLOC_CONF" and args.python:
            runs[m, "cachalot"] = _spawn(m, args, {"CACHALOT_ALLOC_CONF": best["value"]},
                                         python=args.python, cachalot_torch=True)
    measured = {key: _result(p, f"{key[0]} with the {key[1]} recommendation") for key, p in runs.items()}
    rows, ok = [], True
    for m in models:
        report, default = tuned[m]
        base = recorded[m]["peak_reserved"]
        pt = report["best_pytorch"]
        got = measured[m, "pytorch"]["peak_reserved"]
        row = {
            "model": m,
            "default_measured": base,
            "default_predicted": default["peak_reserved_bytes"],
            "best_pytorch": pt["value"],
            "best_pytorch_predicted": pt["peak_reserved_bytes"],
            "best_pytorch_measured": got,
            "losses_equal": measured[m, "pytorch"]["losses"] == recorded[m]["losses"],
        }
        ok &= got == pt["peak_reserved_bytes"] and got < base and row["losses_equal"]
        if (m, "cachalot") in measured:
            best = report["recommended"]
            row.update(recommended=best["value"], recommended_predicted=best["peak_reserved_bytes"],
                       recommended_measured=measured[m, "cachalot"]["peak_reserved"])
            ok &= row["recommended_measured"] == best["peak_reserved_bytes"]
        rows.append(row)
    text = _markdown(rows, capacity)
    print(text)
    with open(os.path.join(args.out, "tune.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "tune.json"), "w") as f:
        json.dump({"capacity": capacity, "rows": rows, "reports": {m: tuned[m][0] for m in models}}, f, indent=1)
    print("tune proof: " + ("every prediction met, every best setting below the default" if ok else "FAILED"))
    return 0 if ok else 1


def _mib(n):
    return f"{n / MIB:.1f} MiB ({n} bytes)"


def _markdown(rows, capacity):
    lines = [
        f"`cachalot tune` on each model's snapshot (capacity {capacity} bytes), then the model again with the setting:",
        "",
        "| model | default: measured | default: predicted | best PyTorch setting | predicted | measured | equal | "
        "recommended (cachalot policy) | predicted | measured | equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rec = ("| - | - | - | - |" if "recommended" not in r else
               f"| `{r['recommended']}` | {_mib(r['recommended_predicted'])} | {_mib(r['recommended_measured'])} "
               f"| {'yes' if r['recommended_predicted'] == r['recommended_measured'] else 'NO'} |")
        lines.append(
            f"| {r['model']} | {_mib(r['default_measured'])} | {_mib(r['default_predicted'])} | `{r['best_pytorch']}` "
            f"| {_mib(r['best_pytorch_predicted'])} | {_mib(r['best_pytorch_measured'])} "
            f"| {'yes' if r['best_pytorch_predicted'] == r['best_pytorch_measured'] else 'NO'} " + rec
        )
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--record", help=argparse.SUPPRESS)
    p.add_argument("--cachalot-torch", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cachalot", help="the cachalot command")
    p.add_argument("--python", help="a Python with cachalot_torch installed (checks the cachalot policy's recommendation)")
    p.add_argument("--out", default="/tmp/cachalot-tune")
    p.add_argument("--models", default="resnet50,gpt2,bert")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--resnet-batch", type=int, default=64)
    p.add_argument("--gpt2-batch", type=int, default=8)
    p.add_argument("--gpt2-seq", type=int, default=512)
    p.add_argument("--gpt2-layers", type=int, default=12)
    p.add_argument("--bert-batch", type=int, default=32)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    if not args.cachalot:
        p.error("--cachalot is required")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())

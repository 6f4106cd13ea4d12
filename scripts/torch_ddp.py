#!/usr/bin/env python3
"""GPT-2 training with DistributedDataParallel, one process per GPU, on cachalot.

Launcher (runs torchrun twice, PyTorch's allocator then cachalot, and compares
the losses step by step):

    python3 scripts/torch_ddp.py --nproc 2   # with the cachalot_torch package installed

One rank (what torchrun starts):

    torchrun --nproc_per_node 2 scripts/torch_ddp.py --rank-main --allocator cachalot

Each rank installs cachalot before touching CUDA (the allocator can only be swapped
before first use), then selects its GPU, joins the NCCL group and trains the same
seeded model on its own seeded random tokens. Rank 0 prints one ``RESULT`` line:
the all-reduced loss of every step, median step time and every rank's peak
reserved memory.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(args):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.distributed as dist

    cachalot = None
    if args.allocator == "cachalot":
        import cachalot_torch

        cachalot_torch.use(conf=f"policy:{args.policy}")
        cachalot = cachalot_torch
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)

    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, n_positions=args.seq)
    try:
        model = GPT2LMHeadModel._from_config(config, attn_implementation="eager")
    except (TypeError, ValueError, AttributeError):
        model = GPT2LMHeadModel(config)
    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cpu").manual_seed(100 + rank)
    tokens = [torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=g).cuda() for _ in range(2)]

    losses, times = [], []
    for i in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ids = tokens[i % 2]
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(mean.item() / world)

    stats = cachalot.memory_stats() if cachalot is not None else torch.cuda.memory_stats()
    peak = torch.tensor([stats["reserved_bytes.all.peak"]], device="cuda", dtype=torch.int64)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if cachalot is not None:
        cachalot.validate()
    if rank == 0:
        result = {
            "allocator": args.allocator if cachalot is None else f"cachalot/{args.policy}",
            "world": world,
            "losses": losses,
            "step_ms_median": statistics.median(times[args.warmup :]) * 1e3,
            "peak_reserved_per_rank": [int(p.item()) for p in peaks],
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def launch(args, allocator):
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
        os.path.abspath(__file__), "--rank-main", "--allocator", allocator, "--policy", args.policy,
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
        "--seq", str(args.seq), "--layers", str(args.layers),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
    raise SystemExit(f"{allocator} run failed (exit {proc.returncode})")


def launcher(args):
    native = launch(args, "native")
    cachalot = launch(args, "cachalot")
    diff = max(abs(a - b) for a, b in zip(native["losses"], cachalot["losses"]))
    for r in (native, cachalot):
        peaks = ", ".join(f"{p / 2**20:.0f} MiB" for p in r["peak_reserved_per_rank"])
        print(f"{r['allocator']:>18}: {r['world']} ranks, {r['step_ms_median']:.2f} ms/step, peak reserved {peaks}")
    print(f"max abs loss difference over {len(native['losses'])} steps: {diff:.3g}")
    print(json.dumps({"native": native, "cachalot": cachalot, "max_abs_loss_diff": diff}))
    return 0 if diff <= args.tolerance else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rank-main", action="store_true", help="run as one torchrun rank")
    p.add_argument("--allocator", choices=["native", "cachalot"], default="cachalot")
    p.add_argument("--policy", choices=["pytorch", "cachalot"], default="cachalot")
    p.add_argument("--nproc", type=int, default=2, help="GPUs (launcher)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--tolerance", type=float, default=0.0, help="largest loss difference accepted")
    args = p.parse_args()
    return rank_main(args) if args.rank_main else launcher(args)


if __name__ == "__main__":
    sys.exit(main())

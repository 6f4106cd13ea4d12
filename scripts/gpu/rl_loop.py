"""An RL-style loop on one GPU with cachalot's sleep and wake: a GPT-2-size
trainer (AdamW) and a generator (its own weights, a KV cache, a decode step
captured in a CUDA graph) take turns for a few rounds; each side's memory is
paused while the other runs. Run with --no-pause it never pauses; the two runs
must give the same losses and generated tokens, and the paused run's peak
device memory must sit near the larger side, not the sum.

Usage: python3 rl_loop.py [--rounds 5] [--json F]          (both runs, compared)
       python3 rl_loop.py --one pause|no-pause             (one run, JSON out)
"""

import argparse
import json
import math
import os
import subprocess
import sys

V, D, LAYERS, HEADS, T = 50257, 768, 12, 12, 512
GEN_BATCH, PROMPT, NEW = 48, 32, 64
TRAIN_BATCH, TRAIN_STEPS = 8, 3


def build(torch):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.fc, self.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def mlp(self, x):
            return self.out(F.gelu(self.fc(self.ln2(x))))

        def heads(self, t):
            b, n, _ = t.shape
            return t.view(b, n, HEADS, D // HEADS).transpose(1, 2)

        def forward(self, x, mask):
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
            q, k, v = self.heads(q), self.heads(k), self.heads(v)
            att = (q @ k.transpose(-1, -2)) / math.sqrt(D // HEADS)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(x.shape)
            x = x + self.proj(y)
            return x + self.mlp(x)

        def step(self, x, cache_k, cache_v, pos, mask):
            """One token per sequence; its k and v go into the cache at `pos`."""
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
            q, k, v = self.heads(q), self.heads(k), self.heads(v)
            here = (torch.arange(T, device=x.device) == pos).view(1, 1, T, 1)
            cache_k.copy_(torch.where(here, k, cache_k))
            cache_v.copy_(torch.where(here, v, cache_v))
            att = (q @ cache_k.transpose(-1, -2)) / math.sqrt(D // HEADS)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ cache_v).transpose(1, 2).reshape(x.shape)
            x = x + self.proj(y)
            return x + self.mlp(x)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln = nn.LayerNorm(D)

        def forward(self, tokens):
            n = tokens.shape[1]
            x = self.wte(tokens) + self.wpe(torch.arange(n, device=tokens.device))
            mask = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
            for b in self.blocks:
                x = b(x, mask)
            return self.ln(x) @ self.wte.weight.T

        def step(self, token, pos, cache):
            x = self.wte(token).unsqueeze(1) + self.wpe(pos).unsqueeze(0)
            mask = (torch.arange(T, device=token.device) <= pos).view(1, 1, 1, T)
            for i, b in enumerate(self.blocks):
                x = b.step(x, cache[i, 0], cache[i, 1], pos, mask)
            return (self.ln(x) @ self.wte.weight.T)[:, -1].argmax(-1)

    return GPT


def used(torch):
    free, total = torch.cuda.mem_get_info()
    return total - free


def run(pause_between):
    import cachalot_torch

    cachalot_torch.use(conf="policy:pytorch")
    import torch
    from cachalot_torch import sleep

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    torch.cuda.init()
    base = used(torch)
    peak = [0]

    def note():
        torch.cuda.synchronize()
        peak[0] = max(peak[0], used(torch) - base)

    def pause(*tags):
        if pause_between:
            for t in tags:
                sleep.pause(t)
        note()

    def resume(*tags):
        if pause_between:
            for t in tags:
                sleep.resume(t)
        note()

    GPT = build(torch)
    with sleep.region("trainer", backup="host"):
        trainer = GPT().cuda()
        opt = torch.optim.AdamW(trainer.parameters(), lr=1e-4)
    with sleep.region("generator", backup="host"):
        gen = GPT().cuda()
        gen.load_state_dict(trainer.state_dict())
        token = torch.zeros(GEN_BATCH, dtype=torch.long, device="cuda")
        pos = torch.zeros(1, dtype=torch.long, device="cuda")
    with sleep.region("kv"):
        cache = torch.zeros(LAYERS, 2, GEN_BATCH, HEADS, T, D // HEADS, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side), sleep.region("generator", backup="host"):
        for _ in range(2):
            nxt = gen.step(token, pos, cache)  # warm-up before the capture
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad(), sleep.cuda_graph(graph, tag="graph"):
        nxt = gen.step(token, pos, cache)
    pause("trainer")  # the generator goes first
    sides = {}
    losses, generated = [], []
    gen_rng = torch.Generator(device="cuda").manual_seed(1)
    for round_ in range(ROUNDS):
        # The generator's turn.
        cache.zero_()
        prompts = torch.randint(0, V, (GEN_BATCH, PROMPT), device="cuda", generator=gen_rng)
        out = [prompts[:, i] for i in range(PROMPT)]
        with torch.no_grad():
            for p in range(PROMPT + NEW - 1):
                token.copy_(out[p])
                pos.fill_(p)
                graph.replay()
                if p + 1 >= PROMPT:
                    out.append(nxt.clone())
        tokens = torch.stack(out, 1)
        generated.append(tokens[:, PROMPT:].tolist())
        note()
        sides["generator"] = used(torch) - base
        pause("kv", "graph", "generator")
        # The trainer's turn.
        resume("trainer")
        with sleep.region("trainer", backup="host"):
            for s in range(TRAIN_STEPS):
                batch = tokens[s * TRAIN_BATCH : (s + 1) * TRAIN_BATCH]
                logits = trainer(batch[:, :-1])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                del logits, loss
        note()
        sides["trainer"] = used(torch) - base
        # The weights to the generator, then the trainer sleeps.
        resume("generator")
        with torch.no_grad():
            for a, b in zip(gen.parameters(), trainer.parameters()):
                a.copy_(b)
        pause("trainer")
        resume("kv", "graph")
        print(f"round {round_}: loss {losses[-1]:.6f}", file=sys.stderr)
    cachalot_torch.validate()
    return {
        "pause": pause_between,
        "losses": losses,
        "generated": generated,
        "peak_used": peak[0],
        "trainer_side": sides["trainer"],
        "generator_side": sides["generator"],
    }


def main():
    global ROUNDS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--one", choices=["pause", "no-pause"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    ROUNDS = args.rounds
    if args.one:
        print(json.dumps(run(args.one == "pause")))
        return 0
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    runs = {}
    for mode in ("no-pause", "pause"):
        cmd = [sys.executable, __file__, "--rounds", str(args.rounds), "--one", mode]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=500)
        sys.stderr.write(done.stderr[-4000:])
        if done.returncode != 0:
            print(f"FAILED: the {mode} run (exit {done.returncode})")
            return 1
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    a, b = runs["no-pause"], runs["pause"]
    gib = 1 << 30
    same_losses = a["losses"] == b["losses"]
    same_tokens = a["generated"] == b["generated"]
    larger = max(b["trainer_side"], b["generator_side"])
    total = a["peak_used"]
    print(f"RL loop, {args.rounds} rounds: losses identical {same_losses}, tokens identical {same_tokens}")
    print(
        f"peak device memory: paused {b['peak_used'] / gib:.2f} GiB, never paused {total / gib:.2f} GiB; "
        f"trainer side {b['trainer_side'] / gib:.2f} GiB, generator side {b['generator_side'] / gib:.2f} GiB"
    )
    failures = []
    if not (same_losses and same_tokens):
        failures.append("the paused run differs from the run that never pauses")
    both = b["trainer_side"] + b["generator_side"]
    if b["peak_used"] > (larger + both) / 2:
        failures.append(
            f"peak {b['peak_used'] / gib:.2f} GiB is nearer the sum of the sides ({both / gib:.2f} GiB) "
            f"than the larger ({larger / gib:.2f} GiB)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": {k: {x: v[x] for x in v if x != "generated"} for k, v in runs.items()},
                       "same_losses": same_losses, "same_tokens": same_tokens, "failures": failures}, f, indent=1)
    print("\n".join(f"FAILED: {f}" for f in failures) or "targets met")
    return 1 if failures else 0


ROUNDS = 5
if __name__ == "__main__":
    sys.exit(main())

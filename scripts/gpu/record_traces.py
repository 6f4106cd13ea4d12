#!/usr/bin/env python3
"""Records PyTorch workloads' allocator traces on the GPU, as the bundled ones in
data/traces were recorded: each workload runs in a fresh process under
PyTorch's native allocator and under expandable segments, with
torch.cuda.memory._record_memory_history on from the first allocation, and
writes <workload>.<label>.trace.csv.gz (DESIGN.md's trace CSV) and
<workload>.<label>.stats.json.gz (the run's facts, checkpoints and PyTorch's
memory_stats at the end).

Workloads (random weights and data: the machine has no network):
  llama_train_bf16  a Llama-style model (transformers LlamaConfig, 4 layers,
                    hidden 1024, GQA 16/8 heads) in bf16, AdamW, 6 steps of
                    batch 8 x 512 random tokens
  gpt2_generate     GPT-2 (124M, fp16) generating 64 new tokens greedily with
                    the KV cache, batch 4, for prompts of 16, 64, 256 and 512
                    tokens
  llama_serve       serving: the Llama-style model above in bf16 (eval,
                    no_grad) answering a seeded random sequence of 12
                    requests (random.Random(0)), each a batch of 1..16 prompts
                    of 16..1024 tokens (ragged, left-padded, attention_mask),
                    generating 8..96 new tokens greedily with the KV cache
                    (736 decode steps, about 60 s and 580,000 events, a 3 MB
                    trace; a decode step takes about 80 ms);
                    LLAMA_SERVE_REQUESTS=N serves N requests of the sequence

Usage: record_traces.py OUT_DIR [WORKLOAD...]
"""
import csv
import gzip
import json
import math
import os
import random
import subprocess
import sys
import time

LABELS = {"native": "", "expandable": "expandable_segments:True"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc",
           "segment_free", "segment_map", "segment_unmap"}


def llama_config(**over):
    """The Llama-style model of llama_train_bf16 and llama_serve (about 112M
    parameters); `over` sets more of LlamaConfig's fields."""
    from transformers import LlamaConfig

    return LlamaConfig(**dict(dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                                   num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                                   max_position_embeddings=1024), **over))


def llama_train(torch, checkpoint, batch=8):
    from transformers import LlamaForCausalLM

    config = llama_config()
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(6):
        tokens = torch.randint(0, config.vocab_size, (batch, 512), device="cuda")
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        checkpoint(f"step {step}")


def gpt2_generate(torch, checkpoint):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model = GPT2LMHeadModel(config).to(device="cuda", dtype=torch.float16).eval()
    with torch.no_grad():
        for prompt in (16, 64, 256, 512):
            tokens = torch.randint(0, config.vocab_size, (4, prompt), device="cuda")
            model.generate(input_ids=tokens, attention_mask=torch.ones_like(tokens),
                           max_new_tokens=64, min_new_tokens=64, do_sample=False,
                           use_cache=True, pad_token_id=config.eos_token_id)
            torch.cuda.synchronize()
            checkpoint(f"prompt {prompt}")


def serve_requests(seed=0, requests=12, batch=16):
    """llama_serve's requests: (prompt lengths, new tokens) for each, drawn
    from random.Random(seed). A request's share of `batch` prompts, its
    longest prompt and its new tokens are drawn apart from `batch`, so a
    larger batch only adds prompts (largest_batch.py bisects on it): the
    largest request holds `batch` prompts, the others ceil(share * batch), at
    least one. A request's first prompt is its longest; the others' lengths
    come from a generator of their own, seeded by (seed, request, prompt)."""
    rng = random.Random(seed)
    drawn = [(rng.random(), rng.randint(16, 1024), rng.randint(8, 96)) for _ in range(requests)]
    top = max(share for share, _, _ in drawn)
    out = []
    for i, (share, longest, new) in enumerate(drawn):
        n = max(1, math.ceil(share / top * batch - 1e-9))
        lengths = [longest] + [random.Random(f"{seed}/{i}/{j}").randint(16, longest) for j in range(1, n)]
        out.append((lengths, new))
    return out


def llama_serve(torch, checkpoint, batch=16, requests=None):
    from transformers import LlamaForCausalLM

    if requests is None:
        requests = int(os.environ.get("LLAMA_SERVE_REQUESTS", "12"))
    # Room for the longest prompt and its answer; token 0 pads.
    config = llama_config(max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    gen = torch.Generator(device="cpu").manual_seed(0)
    with torch.no_grad():
        for i, (lengths, new) in enumerate(serve_requests(0, requests, batch)):
            width = max(lengths)
            # Left padding, as a decoder-only model is served.
            tokens = torch.full((len(lengths), width), config.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(lengths), width), dtype=torch.long)
            for row, n in enumerate(lengths):
                tokens[row, width - n:] = torch.randint(3, config.vocab_size, (n,), generator=gen)
                mask[row, width - n:] = 1
            out = model.generate(input_ids=tokens.to("cuda"), attention_mask=mask.to("cuda"),
                                 min_new_tokens=new, max_new_tokens=new, do_sample=False,
                                 use_cache=True, pad_token_id=config.pad_token_id)
            del out
            torch.cuda.synchronize()
            checkpoint(f"request {i}: {len(lengths)} x {width} + {new}")


WORKLOADS = {"llama_train_bf16": llama_train, "gpt2_generate": gpt2_generate,
             "llama_serve": llama_serve}


def child(workload, label, out_dir):
    """Runs in a fresh process, with PYTORCH_CUDA_ALLOC_CONF already set."""
    import torch

    torch.manual_seed(0)
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(enabled="all", context=None,
                                             max_entries=20_000_000)
    checkpoints = []

    def checkpoint(name):
        checkpoints.append([name, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()])

    start = time.time()
    WORKLOADS[workload](torch, checkpoint)
    stats = write_recording(torch, os.path.join(out_dir, f"{workload}.{label}"), workload, label,
                            LABELS[label], time.time() - start, checkpoints)
    peak = stats["memory_stats"]["reserved_bytes.all.peak"] / 2**20
    print(f"{workload}.{label}: {stats['events']} events, {stats['wall_s']:.1f} s, peak reserved {peak:.0f} MiB")


def write_recording(torch, base, workload, label, conf, wall, checkpoints):
    """Stops the recording begun with torch.cuda.memory._record_memory_history
    and writes the current device's events as <base>.trace.csv.gz (DESIGN.md's
    trace CSV) and the run's facts as <base>.stats.json.gz; returns the facts.
    scripts/torch_dist.py --trace writes its recordings through it too."""
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    device = torch.cuda.current_device()
    events = [e for e in snapshot["device_traces"][device] if e["action"] in ACTIONS]
    with gzip.open(base + ".trace.csv.gz", "wt", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time_us", "action", "addr", "size", "stream"])
        for e in events:
            w.writerow([e["time_us"], e["action"], e["addr"], e["size"], e["stream"]])
    props = torch.cuda.get_device_properties(device)
    stats = {
        "workload": workload,
        "label": label,
        "conf": conf,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": props.name,
        "total_memory": props.total_memory,
        "wall_s": wall,
        "events": len(events),
        "checkpoints": checkpoints,
        "oom": None,
        "allocator_settings": snapshot.get("allocator_settings", {}),
        "memory_stats": dict(torch.cuda.memory_stats()),
    }
    with gzip.open(base + ".stats.json.gz", "wt") as fh:
        json.dump(stats, fh, indent=1)
    return stats


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return 0
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, names = sys.argv[1], sys.argv[2:] or list(WORKLOADS)
    os.makedirs(out_dir, exist_ok=True)
    status = 0
    for name in names:
        for label, conf in LABELS.items():
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
            code = subprocess.call([sys.executable, __file__, "--child", name, label, out_dir],
                                   env=env)
            if code != 0:
                print(f"FAILED: {name}.{label} (exit {code})")
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

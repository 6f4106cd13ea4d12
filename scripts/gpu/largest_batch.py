#!/usr/bin/env python3
"""The largest batch that fits under a memory cap, per workload and allocator.

For each workload and each allocator configuration, searches for the largest
batch size whose run completes without torch.cuda.OutOfMemoryError while
torch.cuda.set_per_process_memory_fraction caps the process at --gib GiB
(converted to a fraction of the device's memory). Each trial is a fresh
process, so nothing is left over from the last one.

Configurations:
  native      PyTorch's caching allocator (PYTORCH_CUDA_ALLOC_CONF unset)
  expandable  PyTorch's, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cachalot    the plug-in, cachalot_torch.use(conf="policy:cachalot")
  pytorch     the plug-in, cachalot_torch.use(conf="policy:pytorch")
The plug-in's two need cachalot_torch in this Python (gpu-torch.sh's venv,
/tmp/cachalot-venv); without it they are skipped.

Workloads (random weights and data: the GPU machine has no network):
  gpt2_varlen  GPT-2 124M (GPT2LMHeadModel, fp32 weights, bf16 autocast)
               training with AdamW, 6 steps, each of a sequence length drawn
               from random.Random(0) in 128..1024; default cap 24 GiB
  llama_train  record_traces.py's Llama-style model in bf16 training with
               AdamW, 6 steps at sequence length 512; default cap 8 GiB
  bert_varlen  BERT-base (BertForMaskedLM, bf16) inference under no_grad, 8
               steps of sequence lengths drawn in 32..512; default cap 4 GiB
  llama_serve  record_traces.py's llama_serve (greedy generation with the KV
               cache, ragged prompts of 16..1024 tokens, 8..96 new tokens)
               with "batch" prompts in its largest request and proportionally
               fewer in the others (record_traces.serve_requests); only the
               first --serve-requests of its requests (default 8, the largest
               among them), a decode step taking about 80 ms; default cap 2 GiB

The search, in rounds of --parallel trials at once (default 3): first the
workload's starting batch and its doubles; while nothing has failed, batches
at 75..100% of an estimate (the batch whose peak allocated bytes, on the
straight line through the smallest and the largest fit, reach the cap: an
upper estimate, since reserved memory is more), or doubles of the largest
fit where there is no estimate, or steps of 1, 2, 4... above it where the
estimate is spent; once a batch has failed, batches evenly inside the
bracket (largest fit, smallest failure), until the two are neighbours. The
search assumes fitting is monotone in the batch (fragmentation can break
that: a fit above the smallest failure is reported in the JSON, and the
answer is the largest fit below it). All (workload, configuration) searches
run at once, each in a thread of its own; a trial goes to its
configuration's own GPU where several are visible (CUDA_VISIBLE_DEVICES per
trial), else to the one with the most room, a GPU taking as many trials at a
time as their caps (plus 2 GiB each for the CUDA context) fit in 90% of its
memory, so that on one GPU the trials queue. A search starts no round after
--budget seconds from its own start, and a trial still running then is
stopped --grace seconds later: the search's answer is then the largest batch
seen to fit, marked unconverged (">="). The whole takes about the budget
(default 270 s) and the grace; on one GPU, where trials queue, give a larger
budget.

Output: a markdown table (workload x configuration: the largest batch, and
peak reserved at that batch) printed at the end and written to --markdown,
every trial in --json (defaults: largest_batch.md and largest_batch.json in
$OUT, else /tmp/cachalot-gpu).

    /tmp/cachalot-venv/bin/python scripts/gpu/largest_batch.py --budget 270
    ... --workloads llama_serve --configs native,cachalot --gib 6
    ... --gib llama_serve=3 --gib gpt2_varlen=16
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30
OOM_EXIT = 3

CONFIGS = {
    "native": {"conf": None, "policy": None},
    "expandable": {"conf": "expandable_segments:True", "policy": None},
    "cachalot": {"conf": None, "policy": "cachalot"},
    "pytorch": {"conf": None, "policy": "pytorch"},
}
# Default cap (GiB) and first batch tried, per workload.
CAPS = {"gpt2_varlen": 24.0, "llama_train": 8.0, "bert_varlen": 4.0, "llama_serve": 2.0}
STARTS = {"gpt2_varlen": 4, "llama_train": 8, "bert_varlen": 32, "llama_serve": 16}


# ----------------------------------------------------------------------------
# Workloads: each runs one trial at batch `batch` in the child process.
# ----------------------------------------------------------------------------


def gpt2_varlen(torch, batch):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()
    model = GPT2LMHeadModel(config).to("cuda").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(0)
    for _ in range(6):
        seq = rng.randint(128, 1024)
        tokens = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
    torch.cuda.synchronize()


def llama_train(torch, batch):
    import record_traces

    record_traces.llama_train(torch, lambda name: None, batch=batch)


def bert_varlen(torch, batch):
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig()
    model = BertForMaskedLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    rng = random.Random(0)
    with torch.no_grad():
        for _ in range(8):
            seq = rng.randint(32, 512)
            tokens = torch.randint(0, config.vocab_size, (batch, seq), device="cuda")
            logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
            del logits
    torch.cuda.synchronize()


SERVE_REQUESTS = [8]  # --serve-requests, as the child was given it


def llama_serve(torch, batch):
    import record_traces

    record_traces.llama_serve(torch, lambda name: None, batch=batch, requests=SERVE_REQUESTS[0])


WORKLOADS = {"gpt2_varlen": gpt2_varlen, "llama_train": llama_train,
             "bert_varlen": bert_varlen, "llama_serve": llama_serve}


def child(workload, config, batch, gib, serve_requests):
    """One trial, in a fresh process whose environment the parent set: prints
    RESULT <json>; exits 0 if the run fitted, OOM_EXIT if it ran out of memory."""
    sys.path.insert(0, HERE)
    SERVE_REQUESTS[0] = serve_requests
    import torch

    policy = CONFIGS[config]["policy"]
    plugin = None
    if policy is not None:
        import cachalot_torch

        cachalot_torch.use(conf=f"policy:{policy}")
        plugin = cachalot_torch
    props = torch.cuda.get_device_properties(0)
    fraction = min(1.0, gib * GIB / props.total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, 0)
    random.seed(0)
    torch.manual_seed(0)
    result = {"workload": workload, "config": config, "batch": batch, "gib": gib,
              "fraction": fraction, "gpu": props.name, "total_memory": props.total_memory,
              "torch": torch.__version__, "cuda": torch.version.cuda}
    if plugin is not None:
        result["plugin"] = {"installed": plugin.installed(), "config": plugin.config()}
    start = time.time()
    code = 0
    try:
        WORKLOADS[workload](torch, batch)
        result["fits"] = True
    except torch.cuda.OutOfMemoryError as e:
        result.update(fits=False, oom="OutOfMemoryError", error=str(e).strip().splitlines()[0][:400])
        code = OOM_EXIT
    except RuntimeError as e:
        # Out of memory met outside the allocator's own error (cuBLAS's
        # workspace, a library's cudaMalloc): it does not fit either.
        text = str(e)
        if "out of memory" not in text.lower() and "ALLOC_FAILED" not in text:
            raise
        result.update(fits=False, oom="RuntimeError", error=text.strip().splitlines()[0][:400])
        code = OOM_EXIT
    result["run_s"] = time.time() - start
    stats = torch.cuda.memory_stats()
    result["peak_reserved"] = stats.get("reserved_bytes.all.peak", 0)
    result["peak_allocated"] = stats.get("allocated_bytes.all.peak", 0)
    result["num_ooms"] = stats.get("num_ooms", 0)
    result["num_alloc_retries"] = stats.get("num_alloc_retries", 0)
    print("RESULT " + json.dumps(result), flush=True)
    return code


# ----------------------------------------------------------------------------
# Parent: the searches, the GPUs' slots, the report.
# ----------------------------------------------------------------------------


def visible_gpus():
    """[(id for CUDA_VISIBLE_DEVICES, memory in GiB)] of the visible GPUs."""
    try:
        rows = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              check=True, timeout=60).stdout.strip().splitlines()
        found = []
        for row in rows:
            index, uuid, mib = (x.strip() for x in row.split(","))
            found.append((index, uuid, float(mib) / 1024))
    except (OSError, subprocess.SubprocessError, ValueError):
        found = []
    if not found:
        out = subprocess.run([sys.executable, "-c", "import torch; n = torch.cuda.device_count(); "
                              "print(' '.join(str(torch.cuda.get_device_properties(i).total_memory) "
                              "for i in range(n)))"], capture_output=True, text=True, timeout=300)
        sizes = [int(x) / GIB for x in out.stdout.split() if x.isdigit()]
        found = [(str(i), None, size) for i, size in enumerate(sizes)]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [(index, size) for index, _, size in found]
    chosen = []
    for item in (x.strip() for x in visible.split(",") if x.strip()):
        for index, uuid, size in found:
            if item == index or (uuid and uuid.startswith(item)):
                chosen.append((item, size))
                break
        else:
            if item.lstrip("-").isdigit() and int(item) < 0:
                break  # CUDA stops at the first invalid ordinal
            chosen.append((item, found[0][2] if found else 80.0))
    return chosen


class Gpus:
    """The visible GPUs' memory shared out among the trials: each trial takes
    its cap plus CONTEXT_GIB from 90% of a GPU's memory, on its search's own
    GPU where there is room, else on the one with the most; a GPU with
    nothing on it takes any trial."""

    CONTEXT_GIB = 2.0

    def __init__(self, found):
        self.ids = [ident for ident, _ in found]
        self.free = {ident: 0.9 * gib for ident, gib in found}
        self.running = {ident: 0 for ident in self.ids}
        self.cond = threading.Condition()

    def acquire(self, need, deadline, home):
        """The GPU a trial runs on, waiting for room until `deadline`; None
        if none came by then."""
        with self.cond:
            while True:
                room = [g for g in self.ids if self.free[g] >= need or not self.running[g]]
                if room:
                    gpu = home if home in room else max(room, key=lambda g: self.free[g])
                    self.free[gpu] -= need
                    self.running[gpu] += 1
                    return gpu
                left = deadline - time.time()
                if left <= 0:
                    return None
                self.cond.wait(timeout=left)

    def release(self, gpu, need):
        with self.cond:
            self.free[gpu] += need
            self.running[gpu] -= 1
            self.cond.notify_all()


class Search:
    """One (workload, configuration): rounds of --parallel trials at once."""

    def __init__(self, args, workload, config, gpus, home, log):
        self.args = args
        self.workload = workload
        self.config = config
        self.gpus = gpus
        self.home = home
        self.log = log
        self.gib = args.caps[workload]
        self.cap = self.gib * GIB
        self.start_batch = args.start or STARTS[workload]
        self.trials = []
        self.lo, self.hi = 0, None  # largest fit below the smallest failure, smallest failure
        self.above = []  # fits above the smallest failure (fitting is then not monotone)
        self.crawl = 0  # rounds spent above a fit that the prediction put at the cap
        self.error = None
        self.converged = False
        self.began = None

    def predict(self):
        """The batch whose peak allocated bytes, on the straight line through
        the smallest and the largest fit below any failure (or proportional
        to one), reaches the cap: an upper estimate, reserved memory being
        more."""
        fits = sorted({t["batch"]: t["peak_allocated"] for t in self.trials
                       if t.get("fits") and t.get("peak_allocated")
                       and (self.hi is None or t["batch"] < self.hi)}.items())
        if not fits:
            return None
        if len(fits) == 1:
            b, peak = fits[0]
            return int(b * self.cap / peak)
        (b1, p1), (b2, p2) = fits[0], fits[-1]
        per = (p2 - p1) / (b2 - b1)
        if per <= 0:
            return None
        return int(b2 + (self.cap - p2) / per)

    def candidates(self):
        """The next round's batches (at most --parallel), none if the search is done."""
        k, lo, hi, limit = self.args.parallel, self.lo, self.hi, self.args.max_batch
        if not self.trials:
            picks = [self.start_batch * 2 ** i for i in range(k)]
        elif hi is None:
            if lo >= limit:
                return []
            guess = self.predict()
            if guess is None or guess > 2 * lo:
                picks = [lo * 2 ** (i + 1) for i in range(k)]
            elif guess > lo:
                # Around the estimate, mostly below it (it overestimates).
                picks = [round(guess * (1 - 0.25 * (k - 1 - i) / max(1, k - 1))) for i in range(k)]
                picks = picks if k > 1 else [guess]
            else:
                # The estimate is spent: steps of 1, 2, 4... above the largest fit.
                picks = [lo + 2 ** (self.crawl * k + i) for i in range(k)]
                self.crawl += 1
            picks = [min(limit, max(lo + 1, b)) for b in picks]
        elif lo == 0:
            if hi <= 1:
                return []
            picks = [max(1, hi >> (i + 1)) for i in range(k)]
        else:
            inside = list(range(lo + 1, hi))
            if len(inside) <= k:
                picks = inside
            else:
                picks = [lo + round((hi - lo) * (i + 1) / (k + 1)) for i in range(k)]
        done = {t["batch"] for t in self.trials}
        return sorted({b for b in picks if b not in done and b > lo and (hi is None or b < hi)})

    def env(self, gpu):
        env = dict(os.environ)
        for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CACHALOT_ALLOC_CONF"):
            env.pop(key, None)
        conf = CONFIGS[self.config]["conf"]
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        env.setdefault("OMP_NUM_THREADS", "4")  # many trials at once on the host's cores
        env.update(CUDA_VISIBLE_DEVICES=gpu, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
        return env

    def trial(self, batch, deadline):
        need = self.gib + Gpus.CONTEXT_GIB
        gpu = self.gpus.acquire(need, deadline, self.home)
        if gpu is None:
            return None
        started = time.time()
        try:
            timeout = max(1.0, min(self.args.trial_timeout, deadline + self.args.grace - started))
            cmd = [sys.executable, os.path.abspath(__file__), "--child", self.workload, self.config,
                   str(batch), repr(self.gib), str(self.args.serve_requests)]
            try:
                proc = subprocess.run(cmd, env=self.env(gpu), capture_output=True, text=True, timeout=timeout)
                code, out, err = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as e:
                code, out, err = "timeout", e.stdout or "", e.stderr or ""
                out = out.decode(errors="replace") if isinstance(out, bytes) else out
                err = err.decode(errors="replace") if isinstance(err, bytes) else err
        finally:
            self.gpus.release(gpu, need)
        wall = time.time() - started
        result = None
        for line in out.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line[len("RESULT "):])
        if code == "timeout":
            # Stopped: past the search's budget (not an error), else past --trial-timeout.
            result = dict(result or {}, batch=batch, fits=None, stderr_tail=err[-3000:],
                          error=None if time.time() >= deadline else f"timed out after {wall:.0f} s")
        elif result is None or code not in (0, OOM_EXIT):
            result = dict(result or {}, batch=batch, fits=None, error=f"exit {code}",
                          stderr_tail=err[-3000:])
        result["wall_s"] = wall
        result["cuda_visible_devices"] = gpu
        return result

    def note(self, result):
        if result["fits"] is None:
            status = f"ERROR {result['error']}" if result.get("error") else "stopped at the budget"
        else:
            status = "fits" if result["fits"] else "out of memory"
        peak = result.get("peak_reserved", 0) / GIB
        self.log(f"{self.workload}/{self.config} (GPU {result['cuda_visible_devices']}, cap {self.gib:g} GiB) "
                 f"batch {result['batch']}: {status}, peak reserved {peak:.2f} GiB, {result['wall_s']:.0f} s")
        if result["fits"] is None and result.get("error"):
            self.log(result.get("stderr_tail", "")[-1500:])

    def run(self):
        self.began = time.time()
        deadline = self.began + self.args.budget
        while len(self.trials) < self.args.max_trials and time.time() < deadline:
            batches = self.candidates()[: self.args.max_trials - len(self.trials)]
            if not batches:
                self.converged = True
                return
            results = [None] * len(batches)

            def one(i, batch):
                results[i] = self.trial(batch, deadline)
                if results[i] is not None:
                    self.note(results[i])

            threads = [threading.Thread(target=one, args=(i, b)) for i, b in enumerate(batches)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            results = [r for r in results if r is not None]
            self.trials += results
            fails = [t["batch"] for t in self.trials if t["fits"] is False]
            self.hi = min(fails) if fails else None
            fits = [t["batch"] for t in self.trials if t["fits"]]
            self.lo = max([b for b in fits if self.hi is None or b < self.hi], default=0)
            self.above = sorted(b for b in fits if self.hi is not None and b > self.hi)
            if any(r["fits"] is None for r in results) or len(results) < len(batches):
                self.error = next((r["error"] for r in results if r["fits"] is None and r.get("error")), None)
                break  # an error, or the budget ran out
        self.converged = self.error is None and not self.candidates()

    def summary(self):
        best = next((t for t in self.trials if t.get("fits") and t["batch"] == self.lo), None)
        return {
            "workload": self.workload,
            "config": self.config,
            "gib": self.gib,
            "largest": self.lo,
            "smallest_failing": self.hi,
            "fits_above_failure": self.above,
            "converged": self.converged and self.error is None,
            "error": self.error,
            "peak_reserved": best["peak_reserved"] if best else None,
            "peak_allocated": best["peak_allocated"] if best else None,
            "search_s": time.time() - self.began if self.began else 0.0,
            "trials": self.trials,
        }


def cell(s):
    if s["error"]:
        return f"error ({s['largest']} fits)" if s["largest"] else "error"
    if s["largest"] == 0:
        return "none fits" if s["converged"] else "?"
    mark, bound = ("", "") if s["converged"] else (">=", f", <{s['smallest_failing']}" if s["smallest_failing"] else "")
    if s["smallest_failing"] is None and s["converged"]:
        mark = ">="  # --max-batch reached
    peak = f" ({s['peak_reserved'] / GIB:.2f} GiB)" if s["peak_reserved"] else ""
    return f"{mark}{s['largest']}{bound}{peak}"


def markdown(report, configs):
    lines = ["| workload | cap | " + " | ".join(configs) + " |",
             "| --- | --- | " + " | ".join("---" for _ in configs) + " |"]
    by = {(s["workload"], s["config"]): s for s in report["searches"]}
    for workload in report["workloads"]:
        row = [workload, f"{report['caps'][workload]:g} GiB"]
        row += [cell(by[(workload, c)]) if (workload, c) in by else "skipped" for c in configs]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("Each cell: the largest batch that ran to the end under the cap "
                 "(torch.cuda.set_per_process_memory_fraction), and the peak reserved at that batch; "
                 "\">=\" where the search stopped before it found a failing batch next to it "
                 "(\"<N\": the smallest batch seen to fail).")
    return "\n".join(lines) + "\n"


def parse_caps(values):
    caps = dict(CAPS)
    for value in values or []:
        if "=" in value:
            name, gib = value.split("=", 1)
            if name not in WORKLOADS:
                raise SystemExit(f"--gib: unknown workload {name}")
            caps[name] = float(gib)
        else:
            caps = {name: float(value) for name in caps}
    return caps


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        workload, config, batch, gib, serve_requests = sys.argv[2:7]
        return child(workload, config, int(batch), float(gib), int(serve_requests))
    out_dir = os.environ.get("OUT") or "/tmp/cachalot-gpu"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated (default: all)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated (default: all)")
    ap.add_argument("--gib", action="append", metavar="[WORKLOAD=]GIB",
                    help="the cap in GiB, for every workload or for one (repeatable); defaults: "
                    + ", ".join(f"{k} {v:g}" for k, v in CAPS.items()))
    ap.add_argument("--budget", type=float, default=270.0, help="seconds per search (default 270)")
    ap.add_argument("--grace", type=float, default=45.0,
                    help="seconds a trial may run past its search's budget (default 45)")
    ap.add_argument("--trial-timeout", type=float, default=200.0, help="seconds per trial (default 200)")
    ap.add_argument("--max-batch", type=int, default=1024)
    ap.add_argument("--max-trials", type=int, default=24, help="per search (default 24)")
    ap.add_argument("--parallel", type=int, default=3, help="trials at a time per search (default 3)")
    ap.add_argument("--serve-requests", type=int, default=8,
                    help="llama_serve's requests: the first N of record_traces.py's (default 8)")
    ap.add_argument("--start", type=int, default=0, help="first batch tried (default: per workload)")
    ap.add_argument("--json", default=os.path.join(out_dir, "largest_batch.json"))
    ap.add_argument("--markdown", default=os.path.join(out_dir, "largest_batch.md"))
    args = ap.parse_args()
    args.caps = parse_caps(args.gib)
    workloads = [w for w in args.workloads.split(",") if w]
    configs = [c for c in args.configs.split(",") if c]
    for name in workloads:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name} ({', '.join(WORKLOADS)})")
    for name in configs:
        if name not in CONFIGS:
            raise SystemExit(f"unknown configuration {name} ({', '.join(CONFIGS)})")
    skipped = {}
    if importlib.util.find_spec("cachalot_torch") is None:
        for name in configs:
            if CONFIGS[name]["policy"]:
                skipped[name] = f"no cachalot_torch in {sys.executable}"
        configs = [c for c in configs if c not in skipped]
        for name, why in skipped.items():
            print(f"skipped {name}: {why}", flush=True)

    found = visible_gpus()
    if not found:
        raise SystemExit("no GPU visible")
    gpus = Gpus(found)
    began = time.time()
    lock = threading.Lock()

    def log(text):
        with lock:
            print(f"[{time.time() - began:5.0f} s] {text}", flush=True)

    log(f"{len(found)} GPU(s): {', '.join(f'{ident} ({gib:.0f} GiB)' for ident, gib in found)}; "
        f"caps {', '.join(f'{w} {args.caps[w]:g} GiB' for w in workloads)}; budget {args.budget:g} s "
        f"per search, {args.parallel} trials at a time")
    searches = [Search(args, w, c, gpus, gpus.ids[i % len(gpus.ids)], log)
                for w in workloads for i, c in enumerate(configs)]
    threads = [threading.Thread(target=s.run, daemon=True) for s in searches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    first = next((t for s in searches for t in s.trials if t.get("gpu") and t.get("torch")), {})
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "gpu": first.get("gpu"),
        "gpus": len(found),
        "total_memory": first.get("total_memory"),
        "torch": first.get("torch"),
        "cuda": first.get("cuda"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "budget_s": args.budget,
        "parallel": args.parallel,
        "serve_requests": args.serve_requests,
        "caps": {w: args.caps[w] for w in workloads},
        "workloads": workloads,
        "configs": configs,
        "skipped": skipped,
        "wall_s": time.time() - began,
        "searches": [s.summary() for s in searches],
    }
    table = markdown(report, configs + list(skipped))
    header = (f"Largest batch under a memory cap ({report['gpu']}, torch {report['torch']}, "
              f"{report['date']}):\n\n")
    print("\n" + header + table, flush=True)
    for path, text in ((args.json, json.dumps(report, indent=1)), (args.markdown, header + table)):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text + ("\n" if not text.endswith("\n") else ""))
    failed = [s for s in searches if s.error]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

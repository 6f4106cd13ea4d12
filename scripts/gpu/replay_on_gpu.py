"""Replays every bundled trace with `cachalot replay --device cuda:0` and on the
simulated device, and checks that the peaks agree (issue 18: a recording replays
on a real GPU through the same library entry as on the simulator). Then a few
recordings pass after pass (`--passes`) under the cachalot policy: every pass's
driver calls and reserved bytes must agree too.

Usage, from the repository root: python3 replay_on_gpu.py CACHALOT [OUT.md]
Prints a table; exits 1 when a peak differs or a replay fails.
"""
import glob
import json
import subprocess
import sys

PEAKS = ("peak_requested_bytes", "peak_allocated_bytes", "peak_reserved_bytes")

# Recordings replayed pass after pass, and how many passes.
REPEATED = ("gpt2_generate", "bert_dynamic", "resnet50")
PASSES = "4"


def replay(cli, trace, device, extra):
    out = subprocess.run([cli, "replay", trace, "--json", "--device", device, *extra],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{device}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def by_pass(report):
    return [(p["driver_calls"], p["reserved_bytes"]) for p in report["passes"]]


def repeated(cli, lines):
    """Appends the table of the repeated replays to `lines`; returns how many
    disagreed with the simulator or failed."""
    lines += ["", f"Pass after pass (`--policy cachalot --passes {PASSES}`), driver calls and reserved MiB per pass:", "",
              "| trace | GPU | simulator | agrees |", "|---|---|---|---|"]
    bad = 0
    for name in REPEATED:
        trace = f"data/traces/{name}.native.trace.csv.gz"
        extra = ["--policy", "cachalot", "--passes", PASSES]
        try:
            sim, gpu = by_pass(replay(cli, trace, "sim", extra)), by_pass(replay(cli, trace, "cuda:0", extra))
        except (RuntimeError, KeyError) as e:
            bad += 1
            lines.append(f"| {name} | failed: {e} | | no |")
            continue
        shown = [", ".join(f"{c} / {r / 2**20:.0f}" for c, r in run) for run in (gpu, sim)]
        bad += gpu != sim
        lines.append(f"| {name} | {shown[0]} | {shown[1]} | {'yes' if gpu == sim else 'NO'} |")
    return bad


def main():
    cli = sys.argv[1]
    table = sys.argv[2] if len(sys.argv) > 2 else None
    runs = [(t, []) for t in sorted(glob.glob("data/traces/*.trace.csv.gz"))]
    # The cachalot policy too, on the native recordings (its own configuration).
    runs += [(t, ["--policy", "cachalot"]) for t in sorted(glob.glob("data/traces/*.native.trace.csv.gz"))]
    lines = ["| trace | policy | peak requested | peak allocated | peak reserved | GPU driver calls | agrees |",
             "|---|---|---:|---:|---:|---:|---|"]
    bad, device = 0, "cuda:0"
    for trace, extra in runs:
        name = trace.split("/")[-1].replace(".trace.csv.gz", "")
        try:
            sim = replay(cli, trace, "sim", extra)
            gpu = replay(cli, trace, "cuda:0", extra)
        except RuntimeError as e:
            bad += 1
            lines.append(f"| {name} | {extra[1] if extra else 'recorded'} | failed: {e} | | | | no |")
            continue
        device = gpu["device"]
        same = all(sim[k] == gpu[k] for k in PEAKS)
        bad += not same
        cells = [f"{gpu[k] / 2**20:.1f} MiB" + ("" if sim[k] == gpu[k] else f" (sim {sim[k] / 2**20:.1f})")
                 for k in PEAKS]
        lines.append(f"| {name} | {gpu['policy']} | {' | '.join(cells)} | {gpu['driver_calls']} | "
                     f"{'yes' if same else 'NO'} |")
    lines.append(f"\n{len(runs) - bad} of {len(runs)} replays on {device} give the simulator's peaks")
    bad += repeated(cli, lines)
    text = "\n".join(lines)
    print(text)
    if table:
        with open(table, "w") as f:
            f.write(text + "\n")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

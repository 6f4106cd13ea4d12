#!/usr/bin/env bash
# A/B of builds of the Rust GPU bench on the threaded pattern (1 and 8
# threads): every executable in DIR is a variant (its file name is its label).
# Each round runs every variant once, the order rotating from round to round
# so that the host's drifts reach every variant alike; a run's figure is the
# median of the bench's own nine rounds. Prints per variant and kind (GPU
# streams, the simulated device shared, an allocator per thread) 8 / 1 for
# each round, their median, the median 8-thread rate, and the median of each
# round's 8-thread rate over the same round's with an allocator per thread
# (the host's drift cancels there, so it compares variants more steadily than
# 8 / 1, whose one thread swings by a third); the raw lines go to
# $OUT/ab.log (or /tmp/ab.log).
# Build each variant here (`cargo bench -p cachalot-bench --bench gpu --no-run`,
# then strip --strip-debug into DIR; check the variants' checksums differ),
# carry DIR, and on the GPU machine: ROUNDS=3 bash scripts/gpu/ab_threads.sh DIR
set -uo pipefail
dir=${1:?usage: ab_threads.sh DIR}
out=${OUT:-/tmp}; rounds=${ROUNDS:-3}
mkdir -p /tmp/ab-noops
mapfile -t vs < <(cd "$dir" && find . -maxdepth 1 -type f -perm -u+x -printf '%f\n' | sort)
[ ${#vs[@]} -gt 0 ] || { echo "no executables in $dir" >&2; exit 2; }
: > "$out/ab.log"
for r in $(seq 1 "$rounds"); do
  for i in "${!vs[@]}"; do
    v=${vs[$(( (i + r) % ${#vs[@]} ))]}
    "$dir/$v" --ops /tmp/ab-noops --out /tmp/ab.json --steps 50000 --window-ms 100 --threads 1,8 2>&1 \
      | grep "scaling cachalot:cachalot" | grep -v "by round" | sed "s/^/$v $r /" >> "$out/ab.log"
  done
done
python3 - "$out/ab.log" "${vs[@]}" <<'PY'
import collections, re, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r"(\S+) (\d+) scaling cachalot:cachalot\s+(\d) threads(.*?): ([\d.]+) ops/us", line)
    if m:
        v, r, t, place, ops = m.groups()
        kind = "gpu" if not place else ("apart" if "per thread" in place else "sim")
        runs[(v, kind, int(r))][t] = float(ops)
print("variant   kind    8 / 1 per round                 median 8/1  median 8-thread ops/us  median 8 / apart 8")
for v in sys.argv[2:]:
    for kind in ["gpu", "sim", "apart"]:
        rounds = [k[2] for k in sorted(runs) if k[:2] == (v, kind) and {"1", "8"} <= runs[k].keys()]
        got = [runs[(v, kind, r)] for r in rounds]
        if got:
            ratios = [g["8"] / g["1"] for g in got]
            aparts = [runs.get((v, "apart", r), {}).get("8") for r in rounds] if kind != "apart" else []
            shares = [g["8"] / a for g, a in zip(got, aparts) if a]
            share = f"{statistics.median(shares):10.3f}" if shares else ""
            print(f"{v:9} {kind:6}  {', '.join(f'{x:.2f}' for x in ratios):30}  "
                  f"{statistics.median(ratios):10.2f}  {statistics.median(g['8'] for g in got):10.2f}  {share}")
PY

#!/usr/bin/env bash
# A/B of builds of the Rust GPU bench on the cost of a side stream: every
# executable in DIR is a variant (its file name is its label). Each round runs
# every variant's replays once (the op lists in OPS, 30 passes each), the
# order rotating from round to round. Each replay of the cachalot policy runs
# twice in the same process, alone and with a side stream holding a block
# (`cachalot:cachalot+side`), so the ratio of their steady states is taken
# within one process, where the host's drift cancels. Prints, per variant and
# trace, each round's ratio and their median; the JSON of every run goes to
# $OUT (or /tmp/ab-side).
# Build each variant here (`cargo bench -p cachalot-bench --bench gpu --no-run`,
# then strip --strip-debug into DIR), carry DIR and the op lists (gpu-bin/cuda),
# and on the GPU machine: ROUNDS=4 bash scripts/gpu/ab_side.sh DIR gpu-bin/cuda/ops
set -uo pipefail
dir=${1:?usage: ab_side.sh DIR OPS}
ops=${2:?usage: ab_side.sh DIR OPS}
out=${OUT:-/tmp/ab-side}; rounds=${ROUNDS:-4}
mkdir -p "$out"
mapfile -t vs < <(cd "$dir" && find . -maxdepth 1 -type f -perm -u+x -printf '%f\n' | sort)
[ ${#vs[@]} -gt 0 ] || { echo "no executables in $dir" >&2; exit 2; }
for r in $(seq 1 "$rounds"); do
  for i in "${!vs[@]}"; do
    v=${vs[$(( (i + r) % ${#vs[@]} ))]}
    "$dir/$v" --ops "$ops" --out "$out/$v.$r.json" --passes 30 --threads 1 --window-ms 10 \
      --steps 1000 > /dev/null 2>&1 || echo "$v round $r failed" >&2
  done
done
python3 - "$out" "${vs[@]}" <<'PY'
import collections, json, os, statistics, sys
out, variants = sys.argv[1], sys.argv[2:]
ratios = collections.defaultdict(list)
for v in variants:
    for name in sorted(os.listdir(out)):
        if not (name.startswith(v + ".") and name.endswith(".json")):
            continue
        for trace, by in json.load(open(os.path.join(out, name))).get("replay", {}).items():
            alone, side = by.get("cachalot:cachalot"), by.get("cachalot:cachalot+side")
            if alone and side:
                ratios[(v, trace)].append(side["ns_steady"] / alone["ns_steady"])
print("variant   trace              side / alone, steady state, per round      median")
for (v, trace), rs in sorted(ratios.items()):
    print(f"{v:9} {trace:18} {', '.join(f'{r:.2f}' for r in rs):36} {statistics.median(rs):6.2f}")
PY

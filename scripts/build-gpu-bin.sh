#!/usr/bin/env bash
# Builds everything the GPU machine needs (it has no Rust) and copies it into a
# folder that the device tool carries: the GPU test binaries, the Rust GPU bench,
# the op lists of the bundled traces, the native (C++) bench and scripts/gpu.sh.
# Usage: scripts/build-gpu-bin.sh [DEST]   (DEST defaults to ./gpu-bin/cuda; gpu-bin is git-ignored)
# Then, on the GPU machine, from the repository root: bash DEST/gpu.sh DEST
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-gpu-bin/cuda}
mkdir -p "$dest/tests" "$dest/ops" "$dest/scripts"

# Test and bench executables, found from cargo's JSON messages.
cargo test --release -p cachalot --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if exe and m.get("target", {}).get("kind") == ["test"] and m["target"]["name"].startswith("gpu"):
        print(exe)
' > /tmp/cachalot-gpu-tests.txt
rm -f "$dest"/tests/*
while read -r exe; do
  name=$(basename "$exe"); strip --strip-debug -o "$dest/tests/${name%-*}" "$exe"
done < /tmp/cachalot-gpu-tests.txt
if cargo bench -p cachalot --bench gpu --no-run --message-format=json >/tmp/cachalot-gpu-bench.json 2>/dev/null; then
  exe=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("executable") and m.get("target", {}).get("name") == "gpu":
        print(m["executable"])
' /tmp/cachalot-gpu-bench.json)
  strip --strip-debug -o "$dest/gpu_bench" "$exe"
else
  echo "note: no gpu bench target yet; the Rust contenders will be skipped" >&2
fi

python3 scripts/trace-to-ops.py "$dest/ops" data/traces/{resnet50,vit_train_bf16,gpt2_train,bert_dynamic}.native.trace.csv.gz
cp scripts/gpu/* "$dest/scripts/"
cp scripts/gpu.sh "$dest/gpu.sh"
du -sh "$dest"
ls -l "$dest" "$dest/tests"

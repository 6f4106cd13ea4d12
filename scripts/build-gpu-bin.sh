#!/usr/bin/env bash
# Builds everything the GPU machine needs (it has no Rust) and copies it into a
# folder that the device tool carries: the GPU test binaries, the Rust GPU bench,
# the op lists of the bundled traces, the native (C++) bench, the RMM wheels for
# its rmm contenders, and scripts/gpu.sh.
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
if cargo bench -p cachalot-bench --bench gpu --no-run --message-format=json >/tmp/cachalot-gpu-bench.json 2>/dev/null; then
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

python3 scripts/trace-to-ops.py "$dest/ops" data/traces/{resnet50,vit_train_bf16,gpt2_train,bert_dynamic,llama_train_bf16,gpt2_generate,llama_serve}.native.trace.csv.gz

# RMM for the native bench's rmm:pool, rmm:arena and rmm:async contenders: its
# two wheels from PyPI, kept zipped (about 5 MB together); on the GPU machine,
# which has no network, native_bench.py unzips them and compiles against them.
# Fetched once into $dest/rmm; without them the bench runs without RMM.
rmm_version=26.10.0 rapids_logger_version=0.3.0
mkdir -p "$dest/rmm"
if ls "$dest/rmm/librmm_cu13-$rmm_version-"*.whl "$dest/rmm/rapids_logger-$rapids_logger_version-"*.whl \
    >/dev/null 2>&1; then
  echo "RMM wheels already in $dest/rmm"
elif ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d "$dest/rmm" \
    "librmm-cu13==$rmm_version" "rapids-logger==$rapids_logger_version"; then
  echo "note: could not fetch the RMM wheels; the native bench will skip the rmm contenders" >&2
fi
find scripts/gpu -maxdepth 1 -type f -exec cp {} "$dest/scripts/" \;
cp scripts/trace-to-ops.py "$dest/scripts/"
cp scripts/gpu.sh "$dest/gpu.sh"
du -sh "$dest"
ls -l "$dest" "$dest/tests"

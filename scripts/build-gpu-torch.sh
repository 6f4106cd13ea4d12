#!/usr/bin/env bash
# Builds the cachalot_torch wheel (the Rust library inside) and copies it, the
# Python tests, the model benchmark, the tuner's proof and the cachalot command
# where the device tool carries them:
# DEST/torch/. scripts/gpu-torch.sh installs the wheel in a fresh virtual
# environment there and runs everything.
# Usage: scripts/build-gpu-torch.sh [DEST]   (DEST defaults to ./gpu-bin, git-ignored)
# CACHALOT_CARGO_PROFILE=release builds faster than the shipped dist profile.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-gpu-bin}
rm -rf "$dest/torch"
mkdir -p "$dest/torch/tests" "$dest/torch/scripts"
pip wheel --no-deps -w "$dest/torch" ./python
# The one-process allocator bench dlopens the plain library.
unzip -o -j -q "$dest"/torch/cachalot_torch-*.whl '*/libcachalot_torch.so' -d "$dest/torch"
cp python/tests/*.py "$dest/torch/tests/"
cp scripts/torch_bench.py scripts/torch_dist.py scripts/gpu/record_traces.py scripts/diffcheck.py scripts/tune_proof.py scripts/gpu/pytorch_tests.py scripts/gpu/pttests_plugin.py scripts/gpu-torch.sh "$dest/torch/scripts/"
# `cachalot tune` for the tuner's proof.
cargo build --release -p cachalot-cli
strip -o "$dest/torch/cachalot" target/release/cachalot
echo "built: $(ls "$dest/torch")"

#!/usr/bin/env bash
# Builds the wheels users install (scripts/build-wheels.sh: the plug-in with its
# C++ allocator prebuilt for torch 2.11 with CUDA 13, and the cachalot command)
# and copies them, the Python tests, the model benchmark, the tuner's proof and
# the plain library and command where the device tool carries them:
# DEST/torch/. scripts/gpu-torch.sh installs the wheels in a fresh virtual
# environment there and runs everything.
# Usage: scripts/build-gpu-torch.sh [DEST]   (DEST defaults to ./gpu-bin, git-ignored)
# CACHALOT_CARGO_PROFILE=release builds faster than the shipped dist profile.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-gpu-bin}
rm -rf "$dest/torch"
mkdir -p "$dest/torch/tests" "$dest/torch/scripts"
scripts/build-wheels.sh "$dest/torch"
# The one-process allocator bench dlopens the plain library; gpu.sh's tuner
# checks run the command.
unzip -o -j -q "$dest"/torch/cachalot_torch-*.whl '*/libcachalot_torch.so' -d "$dest/torch"
unzip -o -j -q "$dest"/torch/cachalot_cli-*.whl '*/scripts/cachalot' -d "$dest/torch"
cp python/tests/*.py "$dest/torch/tests/"
cp scripts/torch_bench.py scripts/torch_dist.py scripts/gpu/record_traces.py scripts/diffcheck.py scripts/tune_proof.py scripts/gpu/pytorch_tests.py scripts/gpu/pttests_plugin.py scripts/gpu/sleep_bench.py scripts/gpu/rl_loop.py scripts/gpu/largest_batch.py scripts/gpu-torch.sh "$dest/torch/scripts/"
echo "built: $(ls "$dest/torch")"

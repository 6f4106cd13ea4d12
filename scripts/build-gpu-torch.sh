#!/usr/bin/env bash
# Builds the PyTorch plug-in (libcachalot_torch.so) and copies it, the Python
# module, its tests and the model benchmark where the device tool carries them:
# DEST/torch/. scripts/gpu.sh runs them when DEST/torch exists.
# Usage: scripts/build-gpu-torch.sh [DEST]   (DEST defaults to ./gpu-bin, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-gpu-bin}
# The dist profile: release, optimized as one unit (fat LTO), as a shipped library.
cargo build --profile dist -p cachalot-torch
mkdir -p "$dest/torch/python" "$dest/torch/scripts"
strip --strip-debug -o "$dest/torch/libcachalot_torch.so" target/dist/libcachalot_torch.so
cp python/*.py "$dest/torch/python/"
cp scripts/torch_bench.py scripts/torch_ddp.py "$dest/torch/scripts/"
echo "built: $(ls "$dest/torch")"

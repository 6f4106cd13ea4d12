#!/usr/bin/env bash
# Builds every GPU artefact into ./gpu-bin (git-ignored): the GPU tests and the
# allocator benchmark (gpu-bin/cuda), the tensor examples (gpu-bin/tensor), the
# snapshot check for PyTorch's memory_viz (gpu-bin/checks) and the PyTorch
# plug-in (gpu-bin/torch). Then, on the GPU machine, from the repository root:
#   bash gpu-bin/cuda/gpu.sh gpu-bin/cuda
# (device tool: carry gpu-bin/cuda, gpu-bin/tensor, gpu-bin/checks, gpu-bin/torch).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build-gpu-bin.sh gpu-bin/cuda
bash scripts/build-gpu-tensor.sh gpu-bin
bash scripts/build-viz-check.sh gpu-bin/checks
bash scripts/build-gpu-torch.sh gpu-bin
du -sh gpu-bin/*

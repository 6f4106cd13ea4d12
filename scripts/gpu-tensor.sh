#!/usr/bin/env bash
# cachalot-tensor's examples on a real GPU, their memory checkpoints compared with
# PyTorch's (data/traces/*.stats.json.gz). Works on its own or as one of gpu.sh's
# "other helpers' GPU checks" (copied to BIN/checks/tensor by build-gpu-tensor.sh).
#
# Usage, on the GPU machine from the repository root: bash BIN/tensor/gpu-tensor.sh [BIN]
#   BIN  the folder scripts/build-gpu-tensor.sh filled (default gpu-bin); the
#        examples are in BIN/tensor.
# Output goes to $OUT/tensor (the device tool's folder) or /tmp/cachalot-gpu/tensor.
set -uo pipefail
bin=${1:-gpu-bin}
out=${OUT:-/tmp/cachalot-gpu}/tensor
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CACHALOT_DEVICE=cuda
# cuBLAS, cuRAND and NVRTC: the CUDA toolkit's, else the ones PyTorch's wheels bring.
libs=$(python3 -c '
import glob, os, site
dirs = [d for p in site.getsitepackages() for d in glob.glob(os.path.join(p, "nvidia", "**", "lib"), recursive=True)]
print(":".join(dirs))' 2>/dev/null)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${libs}:${LD_LIBRARY_PATH:-}
status=0

run() { # name, conf
  local name=$1 conf=$2 file="$out/$1${2:+.expandable}.txt"
  echo "--- $name ${conf:+($conf)}"
  if ! PYTORCH_CUDA_ALLOC_CONF=$conf timeout 300 "$bin/tensor/$name" >"$file" 2>&1; then status=1; echo "FAILED: $name"; fi
  cat "$file"
}

compare() { # output file, stats file
  python3 - "$1" "$2" <<'PY' || status=1
import gzip, json, sys
ours = [l.rstrip("\n").split("\t")[1:] for l in open(sys.argv[1]) if l.startswith("checkpoint\t")]
ours = [[l, int(a), int(r)] for l, a, r in ours]
theirs = json.load(gzip.open(sys.argv[2]))["checkpoints"]
same = ours == theirs
print(("MATCH" if same else "DIFF"), "vs", sys.argv[2], f"({len(ours)} checkpoints)")
if not same:
    for o, t in zip(ours, theirs):
        print("  ours", o, "pytorch", t, "" if o == t else "<--")
sys.exit(0 if same else 1)
PY
}

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run one_gib ""
compare "$out/one_gib.txt" data/traces/seed002.native.stats.json.gz
run one_gib "expandable_segments:True"
compare "$out/one_gib.expandable.txt" data/traces/seed002.expandable.stats.json.gz
run matmul_and_transfers ""
compare "$out/matmul_and_transfers.txt" data/traces/seed004.native.stats.json.gz
run training_leak ""
grep -q "^leak	activations	" "$out/training_leak.txt" || { status=1; echo "FAILED: the leak check did not name the kept tensor"; }
run oom ""
run prefetch ""
run two_gpus ""
exit $status

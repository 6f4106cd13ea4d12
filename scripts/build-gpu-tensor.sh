#!/usr/bin/env bash
# Builds cachalot-tensor's examples in release mode and puts them where the device
# tool carries them: DEST/tensor/<example> and DEST/tensor/gpu-tensor.sh, with
# DEST/checks/tensor calling it (gpu.sh runs every DEST/checks/* from the
# repository root).
# Usage: scripts/build-gpu-tensor.sh [DEST]   (DEST defaults to ./gpu-bin, git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-gpu-bin}
cargo build --release -p cachalot-tensor --examples
mkdir -p "$dest/tensor" "$dest/checks"
for e in one_gib matmul_and_transfers training_leak oom prefetch two_gpus; do
  strip -o "$dest/tensor/$e" "target/release/examples/$e"
done
cp scripts/gpu-tensor.sh "$dest/tensor/gpu-tensor.sh"
cat >"$dest/checks/tensor" <<'SH'
#!/usr/bin/env bash
bin=$(cd "$(dirname "$0")/.." && pwd)
exec bash "$bin/tensor/gpu-tensor.sh" "$bin"
SH
chmod +x "$dest/checks/tensor"
echo "built: $(ls "$dest/tensor" | tr '\n' ' ')"

#!/usr/bin/env bash
# Builds the snapshot-pickle check that scripts/gpu.sh runs on the GPU machine
# (which has PyTorch but no Rust): cachalot replays bundled traces here and writes
# their snapshots as PyTorch pickles into DEST/snapshot_viz.data/, and the
# executable DEST/snapshot_viz runs scripts/check_snapshot_viz.py on each, which
# runs `python3 -m torch.cuda._memory_viz stats|trace|trace_plot|segment_plot`.
# Usage: scripts/build-viz-check.sh [DEST]   (DEST defaults to gpu-bin/checks)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-gpu-bin/checks}
mkdir -p "$dest/snapshot_viz.data"
cargo build --release -p cachalot-cli
for t in seed004.native bert_dynamic.native gpt2_train.expandable; do
  target/release/cachalot summary "data/traces/$t.trace.csv.gz" --abbreviated \
    --pickle "$dest/snapshot_viz.data/$t.pickle" >/dev/null
done
cat > "$dest/snapshot_viz" <<'CHECK'
#!/usr/bin/env bash
# cachalot's snapshot pickles through PyTorch's torch.cuda._memory_viz
# (built by scripts/build-viz-check.sh; run from the repository root).
set -uo pipefail
data=$(dirname "$0")/snapshot_viz.data
out=${OUT:-/tmp/cachalot-gpu}/snapshot_viz
# The pickles at once (no GPU needed; their reports printed in order).
pids=()
for p in "$data"/*.pickle; do
  name=$(basename "$p" .pickle)
  mkdir -p "$out/$name"
  python3 scripts/check_snapshot_viz.py "$p" "$out/$name" > "$out/$name.log" 2>&1 &
  pids+=("$!:$name")
done
status=0
for entry in "${pids[@]}"; do
  wait "${entry%%:*}" || { status=1; echo "FAILED: ${entry#*:}"; }
  cat "$out/${entry#*:}.log"
done
exit $status
CHECK
chmod +x "$dest/snapshot_viz"
ls -l "$dest" "$dest/snapshot_viz.data"

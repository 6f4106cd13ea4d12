#!/usr/bin/env bash
# Everything cachalot checks on a GPU, in one go: the GPU tests, compute-sanitizer
# on them, other helpers' GPU checks, the driver's mapping calls timed, then the
# side-by-side benchmark (PyTorch's native allocator, cudaMallocAsync with a kept
# pool, cachalot with the pytorch policy, cachalot with its own policy, and RMM's
# pool, arena and async resources where BIN/rmm holds RMM's wheels), ending with
# a short table.
#
# Usage, on the GPU machine from the repository root: bash gpu-bin/cuda/gpu.sh [BIN] [--quick]
#   BIN     what scripts/build-gpu-bin.sh built (default gpu-bin/cuda)
#   --quick tests and a short benchmark only (a first check of a new machine)
# ONLY="KEY..." runs only the sections named (record tests sanitizer checks
# replay driver bench torch models diff dist pttests sleep batch; the tables always): the whole script takes longer than
# one 10-minute device call, so a session runs it in four, e.g.
# ONLY="record tests bench", ONLY="sanitizer checks replay driver diff", ONLY="torch"
# (the plug-in suite per policy) and ONLY="models" (real models, the tuner proven); the
# multi-GPU training (dist: DDP and FSDP2, one rank per GPU) needs two GPUs or
# more (DIST_NPROC=1 runs it with one rank) and a call of its own; ONLY=pttests
# runs PyTorch's own CUDA memory tests natively and under both policies
# (PT_TESTS: the test folder of a PyTorch source tree of the machine's torch,
# PT_WHEELS a folder with expecttest's wheel; up to 4 minutes per
# configuration on an H200, so two calls: PT_ARGS="--configs native", then
# PT_ARGS="--configs pytorch,cachalot --reuse FILE" with the first call's
# pttests.json carried back as FILE); ONLY=batch finds, per workload (GPT-2 and
# Llama training, BERT inference, Llama serving), the largest batch that runs
# under a memory cap on each allocator (native, expandable segments,
# policy:cachalot, policy:pytorch; scripts/gpu/largest_batch.py, BATCH_ARGS
# passed on; about 5 minutes on four GPUs, longer on one: a call of its own).
# Results go to $OUT (the device tool's folder) or /tmp/cachalot-gpu.
set -uo pipefail
bin=${1:-gpu-bin/cuda}
quick=${2:-}
out=${OUT:-/tmp/cachalot-gpu}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
status=0
# Everything printed also goes to $OUT/gpu.log; each section's seconds are
# listed at the end.
exec > >(tee "$out/gpu.log") 2>&1
started=$SECONDS; mark=$SECONDS; timings=()
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
section() {
  [ -n "${current:-}" ] && timings+=("$current: $((SECONDS - mark)) s")
  current=$1; mark=$SECONDS
  printf '\n=== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"
}

section "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
nvcc --version | tail -2
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# The drop-in's environment (a fresh venv, the C++ allocator compiled against
# the machine's torch) is made in the background while the tests run; section 6
# waits for it before the benchmarks.
torch_dir="$(dirname "$bin")/torch"
prepare_pid=
if { want torch || want models || want diff || want dist || want pttests || want sleep || want batch; } && ls "$torch_dir"/cachalot_torch-*.whl >/dev/null 2>&1; then
  bash "$torch_dir/scripts/gpu-torch.sh" "$torch_dir" --prepare > /tmp/cachalot-prepare.log 2>&1 &
  prepare_pid=$!
fi

# Runs gpu-torch.sh in mode $1 in the drop-in's environment (made in the
# background above), its log shown once, before the first such run.
drop_in() {
  if [ -z "$prepare_pid" ]; then
    echo "skipped: no cachalot_torch wheel in $torch_dir (scripts/build-gpu-torch.sh builds it)"
    return
  fi
  [ -n "${prepare_shown:-}" ] || { cat /tmp/cachalot-prepare.log; prepare_shown=1; }
  if [ "$prepared" -ne 0 ]; then
    status=1; echo "FAILED: the drop-in's environment"
  else
    bash "$torch_dir/scripts/gpu-torch.sh" "$torch_dir" "$1" || status=1
  fi
}

if want record; then
section "0. recordings: new workloads traced under PyTorch's allocators (record_traces.py), added to the benchmark's op lists"
python3 "$bin/scripts/record_traces.py" "$out/traces" || status=1
python3 "$bin/scripts/trace-to-ops.py" "$bin/ops" "$out"/traces/*.native.trace.csv.gz || status=1
fi

if want tests; then
section "1. GPU tests"
# The CUDA runtime for the backend whose segments come from cudaMalloc
# (gpu_runtime_conformance), where the loader would not find it by itself;
# for the test programs only (torch, later, loads its own).
runtime_libs="${LD_LIBRARY_PATH:-}"
[ -d /usr/local/cuda/lib64 ] && runtime_libs="${runtime_libs:+$runtime_libs:}/usr/local/cuda/lib64"
for t in "$bin"/tests/*; do
  [ -x "$t" ] || continue
  echo "--- $(basename "$t")"
  if ! LD_LIBRARY_PATH="$runtime_libs" "$t" --test-threads=1 --nocapture; then
    status=1; echo "FAILED: $(basename "$t")"
  fi
done

fi

if want sanitizer; then
section "2. compute-sanitizer (memcheck, leak check) on the GPU tests"
# The golden parity test only repeats the allocator logic with many driver calls,
# so the sanitizer runs the backend tests and the integrity stress.
if command -v compute-sanitizer >/dev/null; then
  for run in "gpu_backend" "gpu_allocator integrity"; do
    set -- $run
    [ -x "$bin/tests/$1" ] || continue
    echo "--- memcheck $run"
    compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 --print-limit 20 \
      "$bin/tests/$1" ${2:-} --test-threads=1 > /tmp/sanitizer.log 2>&1
    code=$?
    grep -E "^=========|test result|Program hit" /tmp/sanitizer.log | grep -v "Host Frame" | head -20
    echo "compute-sanitizer exit $code"
  done
else
  echo "skipped: compute-sanitizer not installed"
fi

fi

if want checks; then
section "3. other helpers' GPU checks"
# Other helpers' GPU checks: each executable in gpu-bin/checks/ (beside BIN; carry it
# with its binaries) runs here from the repository root; a non-zero exit fails the run.
for check in "$(dirname "$bin")"/checks/*; do
  [ -f "$check" ] && [ -x "$check" ] || continue
  echo "--- $(basename "$check")"
  "$check" || { status=1; echo "FAILED: $(basename "$check")"; }
done

fi

if want replay; then
section "3b. the bundled traces replayed on the GPU (cachalot replay --device cuda:0) against the simulator"
cli="$(dirname "$bin")/torch/cachalot"
if [ -x "$cli" ]; then
  python3 "$bin/scripts/replay_on_gpu.py" "$cli" "$out/replay_gpu.md" || status=1
else
  echo "skipped: no cachalot command in $(dirname "$bin")/torch (scripts/build-gpu-torch.sh builds it)"
fi

fi

if want driver; then
section "3c. driver costs: cuMemCreate, cuMemMap + cuMemSetAccess, cuMemUnmap, cuMemRelease per handle, by handle size and threads"
if nvcc -O2 -o /tmp/driver_costs "$bin/scripts/driver_costs.cu" -lcuda; then
  /tmp/driver_costs "$out/driver_costs.md" || status=1
else
  status=1; echo "FAILED: building driver_costs.cu"
fi

fi

# The speed comparison runs all the allocators in one process, taking turns
# (native_bench.py --plugin, with the plug-in from scripts/build-gpu-torch.sh
# beside BIN; RMM's pool, arena and async resources too where BIN/rmm holds
# the RMM wheels that scripts/build-gpu-bin.sh fetches); the Rust bench adds
# reserved memory, the simulator's prediction, driver calls and cachalot's
# thread scaling.
passes=20; steps=50000; window=100; turns=${TURNS:-5}
[ "$quick" = --quick ] && { passes=5; steps=5000; window=20; turns=3; }
plugin="$(dirname "$bin")/torch/libcachalot_torch.so"
one_process=()
[ -f "$plugin" ] && one_process=(--plugin "$plugin" --turns "$turns")
# The benchmarks run alone: the drop-in's environment must be ready first.
[ -n "$prepare_pid" ] && { wait "$prepare_pid"; prepared=$?; }
if want bench; then
section "4. benchmark: native contenders, and all of them in one process (C++ extension)"
python3 "$bin/scripts/native_bench.py" --ops "$bin/ops" --out "$out/native.json" \
  --so "$bin/ext/cachalot_native_bench.so" --build-dir /tmp/cachalot-ext --passes $passes --steps $steps \
  --rmm "$bin/rmm" "${one_process[@]}" || status=1
if [ -f "$plugin" ] && [ -f "$bin/ops/bert_dynamic.ops" ]; then
  section "4b. the cachalot policy's memory-for-speed trade on bert_dynamic (cachalot_reuse_slack), one process"
  python3 "$bin/scripts/slack_trade.py" --ops "$bin/ops/bert_dynamic.ops" --plugin "$plugin" \
    --out "$out/slack_trade.md" --so /tmp/cachalot-ext/cachalot_native_bench.so --rmm "$bin/rmm" || status=1
fi
section "5. benchmark: cachalot contenders (Rust)"
if [ -x "$bin/gpu_bench" ]; then
  "$bin/gpu_bench" --ops "$bin/ops" --out "$out/cachalot.json" --passes $passes --steps $steps \
    --window-ms $window || status=1
else
  echo "skipped: no gpu_bench binary in $bin"
fi
if [ ! -f "$bin/ext/cachalot_native_bench.so" ] && [ -f /tmp/cachalot-ext/cachalot_native_bench.so ]; then
  cp /tmp/cachalot-ext/cachalot_native_bench.so "$out/" && echo "built extension copied to \$OUT"
fi

fi

if want torch; then
section "6. PyTorch drop-in: the wheel in a fresh venv, the plug-in suite per policy"
drop_in --run-quick
fi

if want models && [ -z "$quick" ]; then
section "6a. PyTorch drop-in: real models on each allocator, the tuner proven"
drop_in --models
fi

if want diff; then
section "6c. differential checker: random programs on PyTorch's allocator and on the pytorch policy, one process after another (DIFF_SECONDS, default 150)"
drop_in --diff
fi

if want dist; then
section "6b. multi-GPU training: DDP (GPT-2, resnet50) and FSDP2 (Llama), one rank per GPU, each allocator"
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
if [ -n "$prepare_pid" ] && [ "$gpus" -lt 2 ] && [ -z "${DIST_NPROC:-}" ]; then
  echo "skipped: $gpus GPU here; the multi-GPU training needs two or more (DIST_NPROC=1 runs it with one rank)"
else
  drop_in --dist
fi
fi

if want pttests; then
section "6d. PyTorch's own CUDA memory tests (test_cuda.py of PT_TESTS): native, policy:pytorch, policy:cachalot"
drop_in --pttests
fi

if want sleep; then
section "6e. sleep and wake: cachalot's tags against torch_memory_saver and a plain offload; an RL-style loop (SLEEP_WHEELS: a folder with torch_memory_saver's wheel)"
drop_in --sleep
fi

if want batch; then
section "6f. the largest batch under a memory cap: each workload on native, expandable segments, policy:cachalot, policy:pytorch"
drop_in --batch
fi

section "7. tables"
[ -f "$out/torch.md" ] && { echo "PyTorch models on cachalot:"; cat "$out/torch.md"; echo; }
[ -f "$out/tune/tune.md" ] && { cat "$out/tune/tune.md"; echo; }
[ -f "$out/diffcheck.md" ] && { cat "$out/diffcheck.md"; echo; }
[ -f "$out/dist.md" ] && { echo "Multi-GPU training:"; cat "$out/dist.md"; echo; }
[ -f "$out/sleep.md" ] && { echo "Sleep and wake (ms per GiB):"; cat "$out/sleep.md"; echo; }
[ -f "$out/pttests.md" ] && { echo "PyTorch's CUDA memory tests:"; cat "$out/pttests.md"; echo; }
[ -f "$out/largest_batch.md" ] && { cat "$out/largest_batch.md"; echo; }
[ -f "$out/driver_costs.md" ] && { cat "$out/driver_costs.md"; echo; }
[ -f "$out/slack_trade.md" ] && { cat "$out/slack_trade.md"; echo; }
[ -f "$out/replay_gpu.md" ] && { echo "Bundled traces replayed on the GPU:"; cat "$out/replay_gpu.md"; echo; }
python3 "$bin/scripts/table.py" "$out" | tee "$out/table.md"
section "done"
printf '%s\n' "${timings[@]}" "total: $((SECONDS - started)) s, exit $status"
exit $status

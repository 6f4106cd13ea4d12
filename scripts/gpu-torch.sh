#!/usr/bin/env bash
# The PyTorch drop-in on a GPU machine: installs the wheels from
# scripts/build-gpu-torch.sh in a fresh virtual environment (`pip install
# --no-index`: the machine's torch is seen through a .pth file), checks them with
# `python -m cachalot_torch` (under torch 2.11 with CUDA 13 the prebuilt C++
# allocator, compiling nothing: the suite fails if anything was compiled into
# cachalot's cache), runs the plug-in suite once per policy, then (unless
# --quick) the model benchmark and the tuner's proof (scripts/tune_proof.py).
# Usage: bash DIR/scripts/gpu-torch.sh DIR [--quick|--prepare|--run|--run-quick|--models|--diff|--dist|--pttests|--sleep|--batch]
#   --prepare    only the environment and the check (gpu.sh starts it early, in the background)
#   --run        only what follows but the differential checker, in the
#                environment --prepare made (gpu.sh runs the checker apart)
#   --run-quick  the same, without the benchmark and the proof (as --quick):
#                the plug-in suite per policy (about 5 minutes on an H100)
#   --models     only the benchmark and the proof (about 5 minutes), in that environment
#   --diff       only the differential checker (scripts/diffcheck.py: DIFF_PROGRAMS
#                programs per configuration, default 5000, as many as fit in
#                DIFF_SECONDS, default 150, shared out: 5000 take longer than a
#                device call), in that environment
#   --dist       only the multi-GPU training (scripts/torch_dist.py, one rank per
#                GPU, DIST_ARGS passed on), in the environment --prepare made
#   --pttests    only PyTorch's own CUDA memory tests (scripts/pytorch_tests.py)
#                natively and under both policies, in the environment --prepare made:
#                PT_TESTS names a PyTorch source tree's test folder (that of
#                the machine's torch), PT_WHEELS a folder of wheels the tests
#                need that the machine lacks (expecttest), PT_ARGS more options
#   --batch      only the largest batch under a memory cap per workload and
#                allocator (scripts/largest_batch.py: native, expandable
#                segments, policy:cachalot, policy:pytorch; BATCH_ARGS passed
#                on, e.g. "--budget 240 --gib llama_serve=4"), in that environment
set -uo pipefail
dir=$(cd "${1:?usage: gpu-torch.sh DIR [--quick|--prepare|--run|--run-quick|--models|--diff|--dist|--pttests|--sleep|--batch]}" && pwd)
mode=${2:-}
out=${OUT:-/tmp/cachalot-gpu}
mkdir -p "$out"
status=0
venv=/tmp/cachalot-venv
# cachalot's cache of allocators compiled on first use, apart from the user's.
export XDG_CACHE_HOME=/tmp/cachalot-cache
# Folders given relative to where the script was started.
tests=${PT_TESTS:+$(cd "$PT_TESTS" && pwd)}
wheels=${PT_WHEELS:+$(cd "$PT_WHEELS" && pwd)}
sleep_wheels=${SLEEP_WHEELS:+$(cd "$SLEEP_WHEELS" && pwd)}
cd /tmp  # import the installed package, not a checkout's

# What each mode runs, in this order: env (a fresh environment and the
# check), suite (the plug-in suite per policy), diff, models (the benchmark
# and the proof), dist.
case $mode in
  "") steps="env suite diff models" ;;
  --quick) steps="env suite" ;;
  --prepare) steps="env" ;;
  --run) steps="suite models" ;;
  --run-quick) steps="suite" ;;
  --models) steps="models" ;;
  --diff) steps="diff" ;;
  --dist) steps="dist" ;;
  --pttests) steps="pttests" ;;
  --sleep) steps="sleep" ;;
  --batch) steps="batch" ;;
  *) echo "gpu-torch.sh: unknown mode $mode (--quick, --prepare, --run, --run-quick, --models, --diff, --dist, --pttests, --sleep or --batch)" >&2
     exit 2 ;;
esac
step() { [[ " $steps " == *" $1 "* ]]; }

if step env; then
  rm -rf "$venv" "$XDG_CACHE_HOME"
  python3 -m venv "$venv"
  # The machine's torch may live in another environment: the new one sees it
  # through a .pth file (no network to install it again).
  site=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
  python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
    > "$site/machine-packages.pth"
  "$venv/bin/pip" install --no-index --no-deps -q "$dir"/cachalot_torch-*.whl "$dir"/cachalot_cli-*.whl || exit 1
  echo "--- python -m cachalot_torch"
  "$venv/bin/python" -m cachalot_torch || exit 1
fi
if step suite; then
  for policy in pytorch cachalot; do
    echo "--- plug-in suite, policy:$policy"
    CACHALOT_ALLOC_CONF="policy:$policy" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$dir/tests" \
      || { status=1; echo "FAILED: plug-in suite ($policy)"; }
  done
  compiled=$(ls "$XDG_CACHE_HOME/cachalot_torch" 2>/dev/null)
  [ -z "$compiled" ] || { status=1; echo "FAILED: the C++ allocator was compiled ($compiled), not taken prebuilt"; }
fi
if step diff; then
  echo "--- differential checker: random programs on PyTorch's allocator and on the pytorch policy"
  "$venv/bin/python" "$dir/scripts/diffcheck.py" --programs "${DIFF_PROGRAMS:-5000}" \
    --seconds "${DIFF_SECONDS:-150}" --json "$out/diffcheck.json" --markdown "$out/diffcheck.md" || status=1
fi
if step models; then
  "$venv/bin/python" "$dir/scripts/torch_bench.py" --rounds "${TORCH_ROUNDS:-3}" --steps "${TORCH_STEPS:-10}" --warmup 5 \
    --json "$out/torch.json" --markdown "$out/torch.md" || status=1
  echo "--- cachalot tune, proven: each model's snapshot tuned, the model run again with the setting"
  "$venv/bin/python" "$dir/scripts/tune_proof.py" --cachalot "$venv/bin/cachalot" --python "$venv/bin/python" \
    --out "$out/tune" || status=1
fi
if step dist; then
  gpus=$("$venv/bin/python" -c 'import torch; print(torch.cuda.device_count())')
  # shellcheck disable=SC2086  # DIST_ARGS is a list of options
  "$venv/bin/python" "$dir/scripts/torch_dist.py" --nproc "${DIST_NPROC:-$gpus}" \
    --json "$out/dist.json" --markdown "$out/dist.md" ${DIST_ARGS:-} || status=1
fi
if step pttests; then
  [ -n "$tests" ] || { echo "gpu-torch.sh --pttests: set PT_TESTS to the test folder of a PyTorch source tree" >&2; exit 2; }
  if [ -n "$wheels" ]; then
    "$venv/bin/pip" install --no-index --no-deps -q "$wheels"/*.whl || exit 1
  fi
  echo "--- PyTorch's CUDA memory tests ($tests/test_cuda.py): native, policy:pytorch, policy:cachalot"
  # shellcheck disable=SC2086  # PT_ARGS is a list of options
  "$venv/bin/python" "$dir/scripts/pytorch_tests.py" "$tests" --json "$out/pttests.json" \
    --markdown "$out/pttests.md" ${PT_ARGS:-} || status=1
fi
if step sleep; then
  if [ -n "$sleep_wheels" ]; then
    "$venv/bin/pip" install --no-index --no-deps -q "$sleep_wheels"/torch_memory_saver-*.whl || exit 1
  fi
  echo "--- sleep and wake: pause and resume per GiB, cachalot against torch_memory_saver and a plain offload"
  "$venv/bin/python" "$dir/scripts/sleep_bench.py" --gib "${SLEEP_GIB:-8}" --json "$out/sleep.json" \
    --markdown "$out/sleep.md" || status=1
  echo "--- an RL-style loop: trainer and generator take turns, paused against never paused"
  "$venv/bin/python" "$dir/scripts/rl_loop.py" --rounds "${RL_ROUNDS:-5}" --json "$out/rl_loop.json" || status=1
fi
if step batch; then
  echo "--- the largest batch under a memory cap: native, expandable segments, policy:cachalot, policy:pytorch"
  # shellcheck disable=SC2086  # BATCH_ARGS is a list of options
  "$venv/bin/python" "$dir/scripts/largest_batch.py" --json "$out/largest_batch.json" \
    --markdown "$out/largest_batch.md" ${BATCH_ARGS:-} || status=1
fi
exit $status

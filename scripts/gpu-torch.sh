#!/usr/bin/env bash
# The PyTorch drop-in on a GPU machine: installs the wheel from
# scripts/build-gpu-torch.sh in a fresh virtual environment (no network: the
# machine's torch is seen through --system-site-packages), checks it with
# `python -m cachalot_torch`, runs the plug-in suite once per policy, then
# (unless --quick) the model benchmark. Usage: bash DIR/scripts/gpu-torch.sh DIR [--quick]
set -uo pipefail
dir=$(cd "${1:?usage: gpu-torch.sh DIR [--quick]}" && pwd)
quick=${2:-}
out=${OUT:-/tmp/cachalot-gpu}
mkdir -p "$out"
status=0
venv=/tmp/cachalot-venv
rm -rf "$venv"
python3 -m venv "$venv"
# The machine's torch may live in another environment: the new one sees it
# through a .pth file (no network to install it again).
"$venv/bin/python" -c 'import sys, site; print(site.getsitepackages()[0])' > /tmp/cachalot-venv-site
python3 -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
  > "$(cat /tmp/cachalot-venv-site)/machine-packages.pth"
"$venv/bin/pip" install --no-index --no-deps -q "$dir"/cachalot_torch-*.whl || exit 1
cd /tmp  # import the installed package, not a checkout's
echo "--- python -m cachalot_torch"
"$venv/bin/python" -m cachalot_torch || status=1
for policy in pytorch cachalot; do
  echo "--- plug-in suite, policy:$policy"
  CACHALOT_ALLOC_CONF="policy:$policy" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$dir/tests" \
    || { status=1; echo "FAILED: plug-in suite ($policy)"; }
done
if [ "$quick" != --quick ]; then
  "$venv/bin/python" "$dir/scripts/torch_bench.py" --rounds "${TORCH_ROUNDS:-3}" --steps "${TORCH_STEPS:-10}" --warmup 5 \
    --json "$out/torch.json" --markdown "$out/torch.md" || status=1
fi
exit $status

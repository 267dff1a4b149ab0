#!/usr/bin/env bash
# `make cuda-ptxas` (issue 20): the lab's CubeCL attention kernels compiled for an NVIDIA GPU on this
# CPU machine, with the registers, spills and shared memory each kernel gets — what the GPU's own NVRTC
# and driver do with them, without the GPU.
#
# 1. `lab bench cuda-source` (cargo feature `cuda-source`, on lavapipe) writes the CUDA C++ that
#    cubecl-cuda would hand to NVRTC for every kernel of every encoding and launch layout.
# 2. NVRTC and ptxas of CUDA 13.0 (the GPU machine's: driver 580) come from PyPI's NVIDIA wheels,
#    pinned below (133 MB downloaded once into the git-ignored .gpu-sdk/), unpacked into
#    .gpu-sdk/cuda-13.0/.
# 3. scripts/cuda_ptxas.py compiles each file with cubecl-cuda's NVRTC options, then `ptxas -v`.
#
# Usage: bash scripts/cuda-ptxas.sh [OUT_DIR]      (default results/cuda-ptxas; SM=90 HEAD_DIM=64 HEADS=8)
# Writes OUT_DIR/sources/ (the .cu and .ptx files, kernels.tsv), OUT_DIR/ptxas.jsonl, OUT_DIR/ptxas.md.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_WHEELS=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96
             nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85)
PYTHON=${PYTHON:-python3}
SM=${SM:-90}
HEAD_DIM=${HEAD_DIM:-64}
HEADS=${HEADS:-8}
OUT=${1:-results/cuda-ptxas}
SDK=$PWD/.gpu-sdk
CUDA=$SDK/cuda-13.0

if [[ ! -x "$CUDA/bin/ptxas" || ! -e "$CUDA/lib/libnvrtc.so.13" || ! -e "$CUDA/include/mma.h" ]]; then
    mkdir -p "$SDK/wheels/cuda"
    echo "== downloading ${CUDA_WHEELS[*]} from PyPI into $SDK/wheels/cuda"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --python-version 3.11 \
        -d "$SDK/wheels/cuda" "${CUDA_WHEELS[@]}"
    echo "== unpacking into $CUDA"
    rm -rf "$CUDA" "$SDK/cuda-unpack"
    for whl in "$SDK"/wheels/cuda/nvidia_cuda_*.whl; do
        "$PYTHON" -m zipfile -e "$whl" "$SDK/cuda-unpack"
    done
    mv "$SDK/cuda-unpack/nvidia/cu13" "$CUDA"
    rm -rf "$SDK/cuda-unpack"
    chmod +x "$CUDA"/bin/*     # zip extraction drops the mode
fi

echo "== lab bench cuda-source (sm_$SM, $HEADS heads, head_dim $HEAD_DIM) into $OUT/sources"
rm -rf "$OUT/sources"
cargo run --release -q -p lab --features cuda-source -- \
    bench cuda-source --out "$OUT/sources" --sm "$SM" --heads "$HEADS" --head-dim "$HEAD_DIM"

echo "== NVRTC + ptxas"
"$PYTHON" scripts/cuda_ptxas.py --cuda "$CUDA" --sources "$OUT/sources" --sm "$SM" \
    --json "$OUT/ptxas.jsonl" --markdown "$OUT/ptxas.md"

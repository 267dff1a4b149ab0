#!/usr/bin/env bash
# One command on an NVIDIA machine: the lab's CubeCL attention kernels (lab/src/kernels/cube.rs, f32)
# against PyTorch's scaled_dot_product_attention (FlashAttention) and FlexAttention versions of PoPE and
# TAPA, forward and forward+backward, at seq 1024, 4096 and 16384, in bf16 and f32 for PyTorch; then
# the quick model's whole training step on CUDA (`lab bench train-step --backend cuda`) against the
# same model in PyTorch eager on the same GPU (bench/torch_baseline.py --device cuda).
#
#   bash bench/gpu.sh            (or: make bench-gpu)
#
# Needs: a CUDA driver (cubecl-cuda loads it and NVRTC at run time; no CUDA toolkit is needed to
# build), network access on the first build (cubecl-cuda 0.11.3 depends on cubecl-llvm, whose build
# script downloads an LLVM bundle into ~/.local/share/tracel), Rust, and a CUDA build of
# PyTorch >= 2.5 (FlexAttention) for the baselines. Writes
# results/bench/gpu/{gpu.txt,cube.jsonl,torch.jsonl,ratios.txt,train-step-lab.json,train-step-torch.jsonl}.
#
# Environment: SEQS (comma list), BATCH, HEADS, HEAD_DIM, ITERS, WARMUP, ENCODINGS, PYTHON, PRESET.
# Written without access to a GPU: check the first run's output (errors are recorded per case, not fatal).
set -euo pipefail
cd "$(dirname "$0")/.."

SEQS=${SEQS:-1024,4096,16384}
BATCH=${BATCH:-1}
HEADS=${HEADS:-8}
HEAD_DIM=${HEAD_DIM:-64}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
ENCODINGS=${ENCODINGS:-nope,rope,pope,tapa,tapa-linear}
PYTHON=${PYTHON:-python3}
OUT=results/bench/gpu
mkdir -p "$OUT"

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi not found"
    git rev-parse --short HEAD 2>/dev/null || true
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
} | tee "$OUT/gpu.txt"

shape=(--batch "$BATCH" --heads "$HEADS" --head-dim "$HEAD_DIM" --seq "$SEQS" --iters "$ITERS" --warmup "$WARMUP")

echo "== cube kernels (f32), cargo feature cuda"
cargo build --release -p lab --features cuda --example cube_bench
cargo run --quiet --release -p lab --features cuda --example cube_bench -- \
    --device cuda --encodings "$ENCODINGS" "${shape[@]}" | tee "$OUT/cube.jsonl"

echo "== PyTorch: SDPA (nope, rope) and FlexAttention (pope, tapa, tapa-linear), bf16 and f32"
rm -f "$OUT/torch.jsonl"
"$PYTHON" bench/gpu_attention.py --device cuda --dtypes bf16,f32 --encodings "$ENCODINGS" "${shape[@]}" \
    --out "$OUT/torch.jsonl" --cube "$OUT/cube.jsonl" | tee "$OUT/ratios.txt"

echo "== training step of the quick model: lab on CUDA vs PyTorch eager on the same GPU"
cargo build --release -p lab --features cuda
for attention in fused reference; do
    ./target/release/lab bench train-step --preset "${PRESET:-quick}" --backend cuda --attention "$attention" \
        > "$OUT/train-step-lab-$attention.json" || echo "lab train-step ($attention) failed"
    cat "$OUT/train-step-lab-$attention.json"
done
cp "$OUT/train-step-lab-fused.json" "$OUT/train-step-lab.json"
"$PYTHON" bench/torch_baseline.py --shape "$OUT/train-step-lab.json" --device cuda | tee "$OUT/train-step-torch.jsonl"

#!/usr/bin/env bash
# One command on an NVIDIA machine: the lab's CubeCL attention kernels (lab/src/kernels/cube.rs, f32)
# against PyTorch's scaled_dot_product_attention (FlashAttention) and FlexAttention versions of PoPE and
# TAPA, forward and forward+backward, at seq 1024, 4096 and 16384, in bf16 and f32 for PyTorch; then
# the quick model's whole training step on CUDA (`lab bench train-step --backend cuda`) against the
# same model in PyTorch eager on the same GPU (bench/torch_baseline.py --device cuda).
#
#   bash bench/gpu.sh            (or: make bench-gpu)
#
# Two ways to run it:
# - from the GPU bundle (`make gpu-bundle` on a CPU machine, then copy `.gpu/` and run `bash .gpu/gpu.sh`
#   there): no cargo, no network. The script unpacks `.gpu/lab.xz` with Python's lzma, checks that the
#   binary's shared libraries resolve (`ldd`), runs `lab selfcheck --backend cuda` (every fused kernel and
#   two training steps against the CPU reference), then the timings (`lab bench attention`, `lab bench
#   train-step`);
# - from a checkout on a machine with Rust and network (`make bench-gpu`): builds with cargo as before
#   (cubecl-llvm downloads its LLVM bundle on the first build), and also runs the cube_bench example.
# Either needs a CUDA driver (cubecl-cuda loads it and NVRTC at run time) and a CUDA build of
# PyTorch >= 2.5 (FlexAttention) for the baselines. Writes into $OUT (default results/bench/gpu):
# gpu.txt, ldd.txt, selfcheck.txt, cube.jsonl, torch.jsonl, ratios.txt,
# train-step-lab-{fused,reference}.json, train-step-torch.jsonl, indirect-full.log (+ indirect-full/).
#
# Environment: SEQS (comma list), BATCH, HEADS, HEAD_DIM, ITERS, WARMUP, ENCODINGS, PYTHON, PRESET, OUT,
# BACKEND (cuda; cpu or wgpu to rehearse on a CPU machine), INDIRECT_S (seconds of indirect-indexing `full`, 90),
# INDIRECT_JOBS (its runs at once on the GPU, 1), SWEEP_S and SWEEP_JOBS (the default block-width sweep with that many
# run processes sharing the GPU, for runs/hour: 90 s, 4).
# Written without access to a GPU: check the first run's output (errors are recorded per step, not fatal).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/.."

SEQS=${SEQS:-1024,4096,16384}
BATCH=${BATCH:-1}
HEADS=${HEADS:-8}
HEAD_DIM=${HEAD_DIM:-64}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
ENCODINGS=${ENCODINGS:-nope,rope,pope,tapa,tapa-linear}
PYTHON=${PYTHON:-python3}
# The lab's backend: cuda on the GPU machine; cpu or wgpu to rehearse the script on a CPU machine.
BACKEND=${BACKEND:-cuda}
OUT=${OUT:-results/bench/gpu}
mkdir -p "$OUT"

{
    date -u +"%Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "nvidia-smi not found"
    cat "$HERE/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || true
    cat "$HERE/BUILD.txt" 2>/dev/null || true
    "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
} | tee "$OUT/gpu.txt"

shape=(--batch "$BATCH" --heads "$HEADS" --head-dim "$HEAD_DIM" --seq "$SEQS" --iters "$ITERS" --warmup "$WARMUP")

if [[ -f "$HERE/lab.xz" ]]; then
    echo "== the bundle's lab binary (no cargo)"
    LAB=${TMPDIR:-/tmp}/lab-bundle/lab
    mkdir -p "$(dirname "$LAB")"
    "$PYTHON" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as f, open(sys.argv[2], "wb") as g:
    shutil.copyfileobj(f, g)' "$HERE/lab.xz" "$LAB"
    chmod +x "$LAB"
    # The bundle's libstdc++ (Debian bookworm's) when this machine's is older than the binary needs.
    if ! "$LAB" --version > /dev/null 2> "$OUT/version-err.txt" && [[ -f "$HERE/lib/libstdc++.so.6" ]]; then
        echo "lab does not start with this machine's libraries ($(head -1 "$OUT/version-err.txt")); using $HERE/lib"
        export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    export LAB_SWEEPS_DIR="$HERE/sweeps"
    CARGO_ROUTE=0
else
    echo "== building lab with the cargo feature cuda"
    cargo build --release -p lab --features cuda
    LAB=./target/release/lab
    CARGO_ROUTE=1
fi
{ ldd --version 2>&1 | head -1; ldd "$LAB"; } | tee "$OUT/ldd.txt" || true
if grep -q "not found" "$OUT/ldd.txt"; then
    echo "error: shared libraries of $LAB not found on this machine (see $OUT/ldd.txt)" >&2
fi

echo "== lab selfcheck --backend $BACKEND"
"$LAB" selfcheck --backend "$BACKEND" 2>&1 | tee "$OUT/selfcheck.txt" || echo "selfcheck failed (exit status above)"

cube_arg=()
if [[ $CARGO_ROUTE == 1 ]]; then
    echo "== cube kernels (f32), cargo feature cuda"
    cargo run --quiet --release -p lab --features cuda --example cube_bench -- \
        --device cuda --encodings "$ENCODINGS" "${shape[@]}" | tee "$OUT/cube.jsonl"
    cube_arg=(--cube "$OUT/cube.jsonl")
else
    echo "== the fused attention op (f32) through lab bench attention --backend $BACKEND"
    "$LAB" bench attention --backend "$BACKEND" --encodings "$ENCODINGS" "${shape[@]}" > "$OUT/cube.jsonl" \
        || echo "lab bench attention failed"
fi
if [[ -s "$OUT/cube.jsonl" ]]; then cube_arg=(--cube "$OUT/cube.jsonl"); fi

echo "== PyTorch: SDPA (nope, rope) and FlexAttention (pope, tapa, tapa-linear), bf16 and f32"
rm -f "$OUT/torch.jsonl"
"$PYTHON" "$HERE/gpu_attention.py" --device cuda --dtypes bf16,f32 --encodings "$ENCODINGS" "${shape[@]}" \
    --out "$OUT/torch.jsonl" "${cube_arg[@]}" | tee "$OUT/ratios.txt" || echo "PyTorch attention timings failed"

echo "== training step of the quick model: lab on CUDA vs PyTorch eager on the same GPU"
for attention in fused reference; do
    "$LAB" bench train-step --preset "${PRESET:-quick}" --backend "$BACKEND" --attention "$attention" \
        > "$OUT/train-step-lab-$attention.json" || echo "lab train-step ($attention) failed"
    cat "$OUT/train-step-lab-$attention.json"
done
cp "$OUT/train-step-lab-fused.json" "$OUT/train-step-lab.json"
"$PYTHON" "$HERE/torch_baseline.py" --shape "$OUT/train-step-lab.json" --device cuda | tee "$OUT/train-step-torch.jsonl" \
    || echo "PyTorch train-step failed"

# As much of the indirect-indexing `full` preset (the PoPE paper's protocol) as fits in INDIRECT_S (90) seconds, for
# its throughput on this GPU: the log's per-step progress and ms/step; runs cut off by the limit are discarded
# (results are written only when a run finishes) and a later `lab sweep` with the same --out resumes.
echo "== indirect-indexing --preset full on $BACKEND for at most ${INDIRECT_S:-90} s"
timeout "${INDIRECT_S:-90}" "$LAB" sweep indirect-indexing --preset full --backend "$BACKEND" --jobs "${INDIRECT_JOBS:-1}" \
    --out "$OUT/indirect-full" > "$OUT/indirect-full.log" 2>&1 || echo "indirect-indexing stopped (exit $?; the limit is ${INDIRECT_S:-90} s)"
tail -5 "$OUT/indirect-full.log" || true
# Steps reached by each run in the time (its log.txt prints a line every eval_every / 10 steps or so).
for log in "$OUT"/indirect-full/runs/*/log.txt; do
    [[ -f "$log" ]] && echo "$(basename "$(dirname "$log")"): $(grep '^step' "$log" | tail -1)"
done | tee "$OUT/indirect-full-steps.txt" || true

# Many small runs on one GPU: the default block-width sweep with SWEEP_JOBS run processes sharing the device, for
# runs/hour against the CPU's (the 2-core VM: 40 runs in 6-8 min). Finished runs are counted from the log.
echo "== block-width --preset quick on $BACKEND, ${SWEEP_JOBS:-4} runs at once, at most ${SWEEP_S:-90} s"
timeout "${SWEEP_S:-90}" "$LAB" sweep block-width --backend "$BACKEND" --jobs "${SWEEP_JOBS:-4}" --no-progress \
    --out "$OUT/block-width" > "$OUT/block-width.log" 2>&1 || echo "block-width stopped (exit $?)"
echo "runs finished in ${SWEEP_S:-90} s with ${SWEEP_JOBS:-4} jobs: $(ls "$OUT"/block-width/runs/*/runs.parquet 2>/dev/null | wc -l)" \
    | tee "$OUT/block-width-throughput.txt"


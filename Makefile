# lab — common tasks. `make test` is the README's test command and what CI runs.
CARGO ?= cargo
PYTHON ?= python3
PRESET ?= quick
THREADS ?= 2

.PHONY: test build sweep bench bench-torch fmt clean-results help

help:
	@echo "make test           install the test's Python deps (polars), then cargo test --release"
	@echo "make sweep          lab sweep block-width --preset \$$PRESET (default quick)"
	@echo "make bench          criterion benchmarks: generators, fused vs reference attention (all encodings,"
	@echo "                    seq 128/512/2048, peak memory), then the training step fused vs reference"
	@echo "make bench-torch    the quick model's training step: lab vs PyTorch eager, same threads (needs pip install torch)"
	@echo "make build          cargo build --release"

build:
	$(CARGO) build --release --workspace

test:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	$(CARGO) test --release --workspace

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

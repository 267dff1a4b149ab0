# lab — common tasks. `make test` is the README's test command and what CI runs.
CARGO ?= cargo
PYTHON ?= python3
PRESET ?= quick

.PHONY: test build sweep bench fmt clean-results help

help:
	@echo "make test           install the test's Python deps (polars), then cargo test --release"
	@echo "make sweep          lab sweep block-width --preset \$$PRESET (default quick)"
	@echo "make bench          criterion benchmarks (generator throughput)"
	@echo "make build          cargo build --release"

build:
	$(CARGO) build --release --workspace

test:
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
	$(CARGO) test --release --workspace

sweep: build
	./target/release/lab sweep block-width --preset $(PRESET)

bench:
	$(CARGO) bench -p tasks

fmt:
	$(CARGO) fmt --all

clean-results:
	rm -rf results/*/

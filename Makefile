# Gatehouse developer entry points. `make help` lists them.
CARGO ?= cargo
BIN := target/release/gatehouse

.PHONY: help example build test lint fmt ci-deps

help:
	@echo "make example   build and run the cafe example (gateway on :8080, admin on 127.0.0.1:9901)"
	@echo "make test      formatting, clippy, and every test (unit, translate tables, end-to-end)"
	@echo "make build     release build of the gatehouse binary"

build:
	$(CARGO) build --release -p gatehouse

example: build
	GATEHOUSE=$(BIN) examples/cafe/run.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: lint
	$(CARGO) test --workspace --no-fail-fast

# Gatehouse developer entry points. `make help` lists them.
CARGO ?= cargo
BIN := target/release/gatehouse

.PHONY: help example build test lint fmt ci-deps

help:
	@echo "make example   build and run the cafe example (gateway on :8080, admin on 127.0.0.1:9901)"
	@echo "make test      formatting, clippy, and every test (unit, translate fixtures, end-to-end, local kube-apiserver)"
	@echo "make build     release build of the gatehouse binary"
	@echo "make image     container images (buildah, no Docker): target/image, target/images"
	@echo "make helm-e2e  the image and the Helm chart end to end on the local cluster (root)"
	@echo "make bench-seed001 seed 001's scale tests (listeners, HTTPS, routes, upstreams, matches), standalone"
	@echo "                 (BENCH_ARGS='--mode api' or '--mode provisioned': through the local API server, root)"
	@echo "make bench-nfr zero-downtime scaling and longevity (seeds 000, 002) on the local cluster (root)"
	@echo "make conformance  the official Gateway API conformance suite on a local control plane (root;"
	@echo "                 CONFORMANCE_ARGS=--provisioned: through a data plane per Gateway)"
	@echo "make fuzz      every fuzz target for FUZZ_SECONDS (300) each after its corpus (nightly toolchain)"
	@echo "make h2spec    HTTP/2 conformance (h2spec) of gatehouse run, cleartext and TLS"

build:
	$(CARGO) build --release -p gatehouse

example: build
	GATEHOUSE=$(BIN) examples/cafe/run.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Container images without a Docker daemon (buildah): gatehouse and gatehouse-echo as OCI
# archives in target/image and in the local image store target/images; see image/build.
.PHONY: image image-check
image:
	image/build $(IMAGE_ARGS)

# The built image against image/spec and the Dockerfile (same files, user, entrypoint, labels).
image-check:
	image/check

# The fuzz targets (fuzz/, docs/security.md): each replays its committed corpus, then fuzzes
# for FUZZ_SECONDS. FUZZ_ARGS passes more, e.g. `--merge` or `--sanitizer address`.
FUZZ_SECONDS ?= 300
.PHONY: fuzz h2spec
fuzz:
	fuzz/run --seconds $(FUZZ_SECONDS) $(FUZZ_ARGS)

h2spec:
	scripts/h2spec

# Lint and every test; starts a local kube-apiserver for the controller tests (scripts/test).
test:
	scripts/test

# Local Kubernetes control plane for tests (etcd + kube-apiserver + Gateway API CRDs,
# built from Go modules, cached). See cluster/README.md. `eval "$(cluster/up)"` sets KUBECONFIG.
.PHONY: cluster-up cluster-down
cluster-up:
	cluster/up

cluster-down:
	cluster/down

# The test node agent (cluster/cmd/gatehouse-node, cluster/README.md): builds a small image with
# buildah into a temporary OCI store, runs it on its own cluster with the node and checks user,
# capabilities, sysctls, probes, restarts, logs and termination. Needs root and buildah.
.PHONY: cluster-test-node
cluster-test-node:
	cluster/test-node

# gatehouse-lb, the local `type: LoadBalancer` implementation (cluster/cmd/gatehouse-lb,
# cluster/README.md): its own cluster, hand-written EndpointSlices whose endpoints run in network
# namespaces, haproxy in front. Needs root, haproxy, python3, curl and jq.
.PHONY: cluster-test-lb
cluster-test-lb:
	cluster/test-lb

# Data-plane benchmarks against nginx (bench/README.md). BENCH_ARGS passes options, e.g.
# `make bench-dataplane BENCH_ARGS="--quick"` or `BENCH_ARGS="--rev HEAD --pin both"`.
.PHONY: bench-dataplane bench-smoke
bench-dataplane:
	bench/dataplane/run $(BENCH_ARGS)

# CI smoke test: the benchmark pipeline runs end to end, produces figures and sees no errors.
# Never a timing assertion. Output goes to a temporary directory, not bench/results.
bench-smoke:
	bench/dataplane/run --quick --duration 1 --check --out $${TMPDIR:-/tmp}/gatehouse-bench-smoke $(BENCH_ARGS)

# Helm chart test (deploy/helm/test): lint, render with several value sets, apply to a local
# kube-apiserver and check RBAC with `kubectl auth can-i`. Builds helm once (cached).
# `GATEHOUSE_BIN=target/release/gatehouse make helm-test` also runs the controller with the
# chart's ServiceAccount token and checks that no request is denied.
.PHONY: helm-test
helm-test:
	deploy/helm/test

# Helm install to traffic on the local cluster (deploy/helm/e2e): builds the image, runs the
# chart on the node agent with gatehouse-lb, a data plane per Gateway, an upgrade under load.
# Needs root, buildah, haproxy, wrk, curl and nft.
.PHONY: helm-e2e
helm-e2e:
	deploy/helm/e2e

# Seeds 000 (zero-downtime scaling) and 002 (longevity) plus a backend failure, on the local
# cluster with the image (root): bench/results/<date>-<commit>-nfr/report.md. About 75 minutes
# (one-hour soak); `BENCH_ARGS=--quick` is the CI mode (1<->3 replicas, 2-minute soak).
.PHONY: bench-nfr
bench-nfr:
	bench/nfr/run $(BENCH_ARGS)

# Control-plane benchmark (bench/README.md): seed 001's time to ready on a local kube-apiserver,
# 1, 100 and 1000 HTTPRoutes, controller CPU and memory. Needs root (a network namespace for the
# backend). `make bench-controlplane BENCH_ARGS="--quick"` runs N = 1 and 50 in under a minute.
.PHONY: bench-controlplane
bench-controlplane:
	bench/controlplane/run $(BENCH_ARGS)

# Seed 001's five scale tests standalone (gatehouse run -f, no cluster, no root): 64 HTTP and 64
# HTTPS listeners, 1000 routes, 648 upstream servers, 50 matches; bench/README.md.
.PHONY: bench-seed001
bench-seed001: build
	bench/controlplane/seed001 $(BENCH_ARGS)

# The official Gateway API conformance suite (sigs.k8s.io/gateway-api/conformance v1.7.0) on this
# machine, no Docker: local control plane with kube-controller-manager, the conformance node agent
# running the suite's echo-basic backends in network namespaces, `gatehouse controller
# --local-addresses`. Needs root. Report in conformance/reports/. See conformance/README.md.
# `make conformance CONFORMANCE_ARGS="--profiles GATEWAY-HTTP,GATEWAY-TLS"` or `--run-test NAME`.
.PHONY: conformance
conformance:
	conformance/run $(CONFORMANCE_ARGS)

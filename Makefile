# `make run` and `make test` work on a fresh clone: they create .venv,
# install the pinned dependencies and generate the gRPC code when missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(shell find protos -name '*.proto')

.PHONY: run demo test test-fast test-inprocess test-postgres lint protos venv bench clean compose-test k8s-check images swarm-test

venv: $(STAMP)

# The first run installs about 60 packages: pip shows each one (no --quiet), so a minute of it is not silence.
$(STAMP): requirements.txt constraints.txt pyproject.toml setup.py clients/python/pyproject.toml
	@echo "==> creating $(VENV) (first run, or a dependency changed; later runs skip this)"
	$(PYTHON) -m venv $(VENV)
	@echo "==> upgrading pip"
	$(PY) -m pip install --quiet --upgrade pip
	@echo "==> installing the pinned dependencies (requirements.txt)"
	$(PY) -m pip install --progress-bar on -r requirements.txt -c constraints.txt
	@echo "==> installing the client library (clients/python) and bae itself (editable)"
	$(PY) -m pip install --quiet --no-deps -e clients/python
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

protos: bae/proto/__init__.py

bae/proto/__init__.py: $(PROTOS) tools/genproto.py $(STAMP)
	@echo "==> generating the gRPC code (bae/proto)"
	$(PY) tools/genproto.py

run: venv protos
	$(PY) -m bae run $(ARGS)

# The stack with the built-in demo provider (a scripted echo model): a first session needs no API key.
demo: venv protos
	$(PY) -m bae run --demo $(ARGS)

# The store, REST and turn tests again on PostgreSQL, on a server the tests start themselves
# (testkit/postgres_support.py: the Debian postgresql package; skipped without it unless BAE_REQUIRE_POSTGRES=1).
PG_TESTS := tests/unit/test_store.py tests/unit/test_session_bodies.py tests/unit/test_store_durability.py \
	tests/unit/test_postgres_outage.py \
	tests/integration/test_client_rest.py tests/integration/test_admin_api.py \
	tests/integration/test_live_turns.py tests/integration/test_live_stack.py tests/integration/test_live_processes.py \
	tests/integration/test_retention.py tests/integration/test_session_filters.py

test: venv protos
	$(PY) -m pytest $(PYTEST_ARGS)
	BAE_TEST_STORE=postgresql $(PY) -m pytest $(PYTEST_ARGS) $(PG_TESTS)

# The unit tier alone (pytest -m unit): in-process tests, no child process, Docker or PostgreSQL server.
test-fast: venv protos
	$(PY) -m pytest -m unit $(PYTEST_ARGS)

# The in-process tier (pytest -m inprocess): the services in the test's process (testkit/inprocess.py), reached
# over loopback HTTP and gRPC; no service process and no Docker.
test-inprocess: venv protos
	$(PY) -m pytest -m inprocess $(PYTEST_ARGS)

# The whole suite on PostgreSQL (every stack the tests launch gets a database of its own).
test-postgres: venv protos
	BAE_TEST_STORE=postgresql $(PY) -m pytest $(PYTEST_ARGS)

# Ruff, mypy (strict over bae/ and the client library) and the import contracts (lint-imports), all
# configured in pyproject.toml. PYTHONPATH: lint-imports finds bae_client in its source tree.
lint: venv protos
	$(VENV)/bin/ruff check bae clients/python tests testkit bench deploy examples
	$(VENV)/bin/mypy
	PYTHONPATH=clients/python $(VENV)/bin/lint-imports --no-logo

bench: venv protos
	$(PY) -m bench.run $(ARGS)

# The Kubernetes manifests (deploy/kubernetes/): both overlays rendered with `kubectl kustomize`, every object
# validated offline against the Kubernetes schemas kubernetes-validate ships (strict), and the security
# properties asserted. Writes nothing: no bytecode, no pytest cache.
k8s-check: venv
	PYTHONDONTWRITEBYTECODE=1 $(PY) -m pytest -q -p no:cacheprovider deploy/kubernetes/test_manifests.py

# The docker-compose deployment, built from local packages and tested end to end (deploy/compose-test/).
compose-test: venv
	bash deploy/compose-test/run.sh

# The four service images (and the stacks' PostgreSQL + haproxy image), tagged with the version (deploy/images.sh).
images: venv
	bash deploy/images.sh

# The Docker Swarm stack, deployed on a one-node swarm and tested end to end (deploy/swarm-test/).
swarm-test: venv
	bash deploy/swarm-test/run.sh

clean:
	rm -rf $(VENV) bae/proto .pytest_cache

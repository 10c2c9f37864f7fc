# ConvS2S for fairseq. `make demo` runs the main job, `make test` the tests;
# both build the virtual environment first (see `install`).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Where corpora are read from (and downloaded to when missing).
DATA ?= $(abspath ../shared/data)
export CONVS2S_DATA := $(DATA)

.PHONY: install test test-slow demo clean

# A virtual environment inside the checkout, built from nothing. torch is
# installed first and pinned through PIP_CONSTRAINT, which pip also hands to
# fairseq's isolated build environment (a plain `-c` would not reach it, and
# an unpinned torch there pulls GBs of CUDA packages). The stamp makes a second
# call a no-op unless setup.py changed.
install: $(VENV)/.installed

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	echo "torch==$(TORCH_VERSION)" > $(VENV)/constraints.txt
	PIP_CONSTRAINT=$(abspath $(VENV)/constraints.txt) $(PY) -m pip install -q -e ".[test,align]"
	touch $@

test: install
	$(PY) -m pytest -q tests

# The real runs that take longer than the default suite.
test-slow: install
	$(PY) -m pytest -q -m slow tests

clean:
	rm -rf $(VENV) build *.egg-info

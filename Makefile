# ConvS2S for fairseq. `make demo` runs the main job, `make test` the tests; both build the
# virtual environment first (see `install`). Recipes: `make recipe-wmt16-en-ro` and friends,
# `SMOKE=1` for a tiny, fast run on local data, `ARGS="key=value ..."` for hydra overrides.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Where corpora are read from, and downloaded to when missing: DATA=DIR, passed on to the recipes
# and tests as CONVS2S_DATA. Without it, convs2s_recipes.corpora.data_root() decides (CONVS2S_DATA,
# else ../shared/data beside the folder make runs in, the checkout, where it exists, else
# $XDG_CACHE_HOME/convs2s or ~/.cache/convs2s); `.venv/bin/convs2s-data --where` prints it.
DATA ?=
ifneq ($(DATA),)
export CONVS2S_DATA := $(abspath $(DATA))
endif
# Work folder of a recipe (default: work/NAME in the checkout, where make runs); ARGS: hydra
# overrides; SMOKE=1: smoke mode. Threads: OMP_NUM_THREADS=N make ... sets them; by default the
# recipe uses the cores that are idle when it starts (fairseq_convs2s_ext/threads.py).
WORK ?=
ARGS ?=
RECIPE = $(PY) -m convs2s_recipes.run $(if $(WORK),--work "$(WORK)") $(if $(SMOKE),--smoke)

.PHONY: install test test-slow gpu-check demo docs clean \
	recipe-wmt16-en-ro recipe-wmt14-en-de recipe-wmt14-en-fr recipe-gigaword recipe-multi30k-unk

# A virtual environment inside the checkout, built from nothing. torch is installed first
# and pinned through PIP_CONSTRAINT, which pip also hands to fairseq's isolated build
# environment (a plain `-c` would not reach it, and an unpinned torch there pulls GBs of
# CUDA packages). The lean beam step's CPU kernel is compiled here (about 40 s) rather
# than at the first translation; where it cannot be, a warning says why and translation
# uses torch's operations. The stamp makes a second call a no-op unless setup.py changed.
install: $(VENV)/.installed

$(VENV)/.installed: setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)"
	echo "torch==$(TORCH_VERSION)" > $(VENV)/constraints.txt
	PIP_CONSTRAINT=$(abspath $(VENV)/constraints.txt) $(PY) -m pip install -q -e ".[test,align,docs,bench]"
	$(PY) -c "import logging; logging.basicConfig(level=logging.INFO, format='%(message)s'); \
		from convs2s_serving import top_log_probs; top_log_probs.load()"
	touch $@

test: install
	$(PY) -m pytest -q --durations=15 tests

# The real runs that take longer than the default suite.
test-slow: install
	$(PY) -m pytest -q -m slow tests

# On a machine with a GPU: the CUDA tests, then fconv against ours with fairseq-train and
# fairseq-generate (fp32 and fp16, 4000 and 12000 tokens, wmt_en_ro and wmt_en_de), one table
# with the GPU's name (bench/gpu.py; GPU_ARGS="--compile" adds ours under torch.compile).
GPU_ARGS ?=
gpu-check: install
	$(PY) -m pytest -q -m cuda tests
	$(PY) -m bench.gpu $(GPU_ARGS)

# The main job: Multi30k en-de, a small ConvS2S trained for about 15 minutes on CPU,
# beam-5 translation of test_2016_flickr and its sacreBLEU.
demo: install
	$(RECIPE) multi30k-demo $(ARGS)

recipe-wmt16-en-ro: install
	$(RECIPE) wmt16-en-ro $(ARGS)

recipe-wmt14-en-de: install
	$(RECIPE) wmt14-en-de $(ARGS)

recipe-wmt14-en-fr: install
	$(RECIPE) wmt14-en-fr $(ARGS)

recipe-gigaword: install
	$(RECIPE) gigaword $(ARGS)

# Unknown-word replacement: the demo's model at word level, sacreBLEU without and with --replace-unk.
recipe-multi30k-unk: install
	$(RECIPE) multi30k-unk $(ARGS)

# The documentation site into site/ (mkdocs.yml; warnings are errors). `mkdocs serve` to browse it.
docs: install
	$(PY) -m mkdocs build --strict -d site

clean:
	rm -rf $(VENV) build *.egg-info

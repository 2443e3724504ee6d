# Set-up and everyday commands. See README.md.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= configs/sample.yaml
CLIP ?= data/sample/test/00003.flac
SCHEDULER ?= local
STAGE ?= Train
# TASK=fr: one task of a multi-task config (multitask.tasks[].name) for make rerun; default: every task.
TASK ?=
SCHEDULER_FLAG := $(if $(filter local,$(SCHEDULER)),--local-scheduler,)
PYTEST_ARGS ?=
# GPU=1: TensorFlow with CUDA (the `gpu` extra) instead of the CPU build, in a venv of its own kind.
GPU ?=
TF_EXTRA := $(if $(GPU),gpu,cpu)

LINTED := pipeline tasks native_client bench tests data

.PHONY: setup kenlm fetch-models test-tools train rerun test test-long test-fast scheduler bench docs lint clean

## The venv in .venv with everything (TensorFlow's CPU build; GPU=1: the CUDA build, in a fresh venv).
setup: $(VENV)/.installed-$(TF_EXTRA)

$(VENV)/.installed-$(TF_EXTRA): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11 or set PYTHON=..."; exit 1; }
	@# tensorflow-cpu and tensorflow share the tensorflow/ package: never install one over the other.
	@have=$$(cat $(VENV)/.tensorflow 2>/dev/null || { test -x $(BIN)/pip && { $(BIN)/pip show -q tensorflow-cpu >/dev/null 2>&1 && echo cpu || \
	  { $(BIN)/pip show -q tensorflow >/dev/null 2>&1 && echo gpu; }; }; }); \
	if [ -n "$$have" ] && [ "$$have" != "$(TF_EXTRA)" ]; then \
	  echo "$(VENV) holds the $$have build of TensorFlow; remove it (rm -rf $(VENV)) to install the $(TF_EXTRA) one"; exit 1; fi
	@# A Python without ensurepip (Debian without python3.X-venv) leaves a venv without pip behind: remove it.
	@test -x $(BIN)/pip || { rm -rf $(VENV); $(PYTHON) -m venv $(VENV) >/dev/null 2>&1 && test -x $(BIN)/pip; } || { \
	  rm -rf $(VENV); v=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  echo "error: $(PYTHON) -m venv made no pip (this Python lacks ensurepip): install python$$v-venv (apt-get install -y python$$v-venv) or another Python 3.11 (PYTHON=...), then run make setup again"; exit 1; }
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,$(TF_EXTRA)]'
	echo $(TF_EXTRA) > $(VENV)/.tensorflow
	touch $@

## KenLM's own lmplz, build_binary, filter and query, compiled from the pinned kenlm sdist into .venv/bin
## (the LanguageModel stage uses them when present; without them it falls back to the Python estimator).
KENLM_VERSION := 0.3.0
KENLM_DEBS := cmake libboost-program-options-dev libboost-system-dev libboost-thread-dev libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev
kenlm: $(BIN)/lmplz

$(BIN)/lmplz: | setup
	@missing=$$(for p in $(KENLM_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "make kenlm needs these Debian packages: apt-get install -y" $$missing; exit 1; fi
	rm -rf build/kenlm && mkdir -p build/kenlm
	$(BIN)/pip download --quiet --no-deps --no-binary :all: --no-build-isolation kenlm==$(KENLM_VERSION) -d build/kenlm
	tar -xzf build/kenlm/kenlm-$(KENLM_VERSION).tar.gz -C build/kenlm
	cmake -S build/kenlm/kenlm-$(KENLM_VERSION) -B build/kenlm/build -DKENLM_MAX_ORDER=6 -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build build/kenlm/build --target lmplz build_binary filter query -j $$(nproc)
	install -m 755 build/kenlm/build/bin/lmplz build/kenlm/build/bin/build_binary build/kenlm/build/bin/filter build/kenlm/build/bin/query $(BIN)/

## The real DeepSpeech-family models some tests and bench/finetune.py need (armspeech 0.1.4's Coqui STT
## .tflite), into ~/.cache/luigi-deepspeech/models (see data/fetch_models.py); checked by SHA-256, fetched once.
fetch-models: | setup
	$(BIN)/python data/fetch_models.py

## Run the whole DAG on CONFIG (default: the embedded sample corpus), then transcribe CLIP.
train: setup
	$(BIN)/deepspeech-train Evaluate --config $(CONFIG) $(SCHEDULER_FLAG)
	$(BIN)/deepspeech-train Transcribe --config $(CONFIG) --audio $(CLIP) $(SCHEDULER_FLAG)

## Force STAGE (a task name) to run again with its dependents, e.g. make rerun STAGE=Train; earlier stages are kept.
## A multi-task config: TASK=fr for one task's stage (make rerun STAGE=Evaluate TASK=fr), every task's without.
rerun: setup
	$(BIN)/python -m tasks.rerun $(STAGE) --config $(CONFIG) --audio $(CLIP) $(SCHEDULER_FLAG) $(if $(TASK),--task $(TASK)) $(RERUN_ARGS)

## What the tests need beyond the venv, each once: the real models (fetch-models) and the Debian packages
## espeak-ng (speaks the test corpora) and sox (converts and pipes audio), installed when run as root and
## missing; otherwise the tests that need them skip, naming the apt-get command. KenLM's tools stay
## optional (make kenlm: a few minutes of compiling); their tests skip without them.
TEST_DEBS := espeak-ng sox
test-tools: fetch-models
	@missing=$$(for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "note: the tests that need$$(printf ' %s' $$missing) skip; to run them: apt-get install$$(printf ' %s' $$missing)"; fi; \
	fi

## The test suite (what CI runs), in TEST_WORKERS processes, each test file in one of them; the heaviest
## tests (marked long) are left to test-long, which CI runs too. Budget (docs/TESTING.md): under 20 minutes
## on the slower (AVX2-only) EPYC of the developers' machine kind; test-long under 30.
TEST_WORKERS ?= 2
test: setup test-tools
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not long" $(PYTEST_ARGS)

## The heaviest fault and training tests (a minute or more each: multi-worker kills, luigid, tiny trainings).
test-long: setup test-tools
	$(BIN)/python -m pytest -q -m long $(PYTEST_ARGS)

## Only the fast tests (skips the ones that train for minutes).
test-fast: setup test-tools
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not long" $(PYTEST_ARGS)

## The central Luigi scheduler on 127.0.0.1:8082 (UI at http://127.0.0.1:8082, task history at /history):
## its state, task history (history.db) and daily rotated log in <work_dir>/luigid (docs/OPERATIONS.md).
scheduler: setup
	@dir=$$($(BIN)/python -c "from pipeline.config_loader import load_config; from pipeline.layout import Layout; print(Layout(load_config('$(CONFIG)')).work_dir)")/luigid; \
	mkdir -p $$dir && echo "luigid state, task history and logs in $$dir; UI at http://127.0.0.1:8082" && \
	$(BIN)/python -m tasks.scheduler --address 127.0.0.1 --port 8082 --state-dir $$dir

## Benchmarks; each prints a JSON object as its last line.
bench: setup
	$(BIN)/python bench/features.py
	$(BIN)/python bench/train.py
	$(BIN)/python bench/infer.py
	$(BIN)/python bench/decoder.py
	$(BIN)/python bench/scale.py
	$(BIN)/python bench/lm.py
	$(BIN)/python bench/importers.py

## docs/CONFIGURATION.md, generated from the config schema's field docs (a test fails when it is stale).
docs: setup
	$(BIN)/python -m pipeline.config_reference > docs/CONFIGURATION.md.tmp
	mv docs/CONFIGURATION.md.tmp docs/CONFIGURATION.md

lint: setup
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/python -m compileall -q $(LINTED)
	@# The floors and the no-cycle rule (pyproject.toml [tool.importlinter]; docs/ARCHITECTURE.md).
	$(BIN)/lint-imports --no-cache
	@! grep -rn "import luigi\|from luigi" pipeline || { echo "pipeline/ must not import luigi"; exit 1; }
	@! grep -rn "import luigi\|from luigi\|import pipeline\|from pipeline\|import tasks\|from tasks" native_client || { echo "native_client/ must not import luigi or the training code"; exit 1; }

clean:
	rm -rf $(VENV) .venv-pyctcdecode build *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

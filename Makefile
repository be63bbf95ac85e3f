# Two commands for a newcomer: `make trace SCHED=gpipe M=8` and `make test`. Every target sets up
# .venv first (once; again only when pyproject.toml changes).

SCHED  ?= gpipe        # gpipe | 1f1b | interleaved | zb   (ENGINE=torch adds zbv, dualpipev)
M      ?= 8            # microbatches per step
P      ?=              # pipeline ranks, one process each; empty = 4 on CUDA, min(4, usable cores) on CPU
DP     ?= 1            # pipelines (data-parallel replicas): P x DP ranks in all
DP_OVERLAP ?= 0        # 1: all-reduce each gradient bucket during the last backward (DDP's way); 0: after it
V      ?= 1            # chunks per rank (interleaved)
PRESET ?=              # model size: seed (GPU) | cpu; empty = seed on CUDA, cpu otherwise
ENGINE ?= native       # native (runners/execute.py) | torch (torch.distributed.pipelining)
STEPS  ?= 3            # profiled steps per run
DEVICE ?= auto         # auto (CUDA when there is a GPU; fewer than P: P streams on one) | cpu | cuda
ROWS_PER_MB ?=         # fix the rows per microbatch (batch = M x this); empty = the preset's batch
INJECT ?=              # delays injected on purpose, e.g. host:0:20,slow:1:2 (runners/inject.py)
CALIBRATE_ADVICE ?= 0  # 1: also time what `make advise` would assume (chunks at each v, I and W)
MODEL  ?=              # your stages: package.module:factory (runners/stage_factory.py); empty = the preset's
MS     ?= 1 2 4 8 16 32  # the m values of `make sweep`, `make predict` and `make advise`
MEMORY_MB ?=           # `make advise`: the activation memory per rank a candidate may hold, MiB
RUN    ?= traces/latest
A      ?=              # `make diff`: the run before (a run directory)
B      ?=              # `make diff`: the run after
FAIL_ON ?=             # `make diff`: exit 1 when a significant change breaks a rule, e.g. step_time:+5% or @FILE
TRACES ?= traces        # the folder of run directories `make report` reads
BENCH_ARGS ?=          # e.g. --only throughput --sizes-mb '50 1000' (see python -m bench --help)
# On a CPU-only machine torch==2.13.0 resolves to the CPU build on disk; on a GPU machine to PyPI's
# CUDA build. Override to pick another build, e.g. TORCH_SPEC="torch==2.13.0 --index-url ...".
TORCH_SPEC ?= torch==2.13.0

PY := .venv/bin/python
comma := ,
space := $(subst ,, )
# A variable's value as one shell word, whatever it holds (spaces, quotes, `;`): in '...', each ' as '\''.
# Every value reaches its command as written, and the command refuses it in one line if it is no value.
quote = '$(subst ','\'',$(strip $(1)))'
RUN_ARGS = --sched $(call quote,$(SCHED)) $(if $(strip $(P)),--p $(call quote,$(P))) --v $(call quote,$(V)) \
           --engine $(call quote,$(ENGINE)) --steps $(call quote,$(STEPS)) --device $(call quote,$(DEVICE)) \
           $(if $(strip $(PRESET)),--preset $(call quote,$(PRESET))) \
           $(if $(strip $(ROWS_PER_MB)),--rows-per-mb $(call quote,$(ROWS_PER_MB))) \
           $(if $(strip $(INJECT)),--inject $(call quote,$(INJECT))) $(if $(strip $(MODEL)),--model $(call quote,$(MODEL))) \
           --dp $(call quote,$(DP)) --dp-overlap $(call quote,$(DP_OVERLAP)) --calibrate-advice $(call quote,$(CALIBRATE_ADVICE))

.PHONY: setup setup-dev trace sweep analyze merge predict advise diff hta report bench lint test fuzz browser clean
.DEFAULT_GOAL := trace

# The runtime (what `make trace` needs) first; the test, lint and benchmark tools on top, only for the
# targets that use them.
.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check $(TORCH_SPEC)
	.venv/bin/pip install -q --disable-pip-version-check -e .
	touch $@

.venv/.installed-dev: .venv/.installed
	.venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

.venv/.installed-hta: .venv/.installed
	.venv/bin/pip install -q --disable-pip-version-check -e '.[hta]'
	touch $@

setup: .venv/.installed
setup-dev: .venv/.installed-dev

# The runner writes the directory of the run it made to fd 3, which the shell takes as `run` (its output
# goes on to make's, fd 4): analyze, merge and report work on that run, whatever traces/latest points at
# by then (another run may have finished meanwhile).
trace: setup
	exec 4>&1; run=$$(3>&1 1>&4 $(PY) -m runners trace $(RUN_ARGS) --m $(call quote,$(M)) --run-dir-to /dev/fd/3) && \
	$(PY) -m analysis analyze "$$run" && $(PY) -m analysis merge "$$run" && $(PY) -m analysis report

sweep: setup
	$(PY) -m runners sweep $(RUN_ARGS) --ms $(call quote,$(MS))
	$(PY) -m analysis report

analyze: setup
	$(PY) -m analysis analyze $(call quote,$(RUN))

merge: setup
	$(PY) -m analysis merge $(call quote,$(RUN))

predict: setup
	$(PY) -m analysis predict $(call quote,$(RUN)) --ms $(call quote,$(subst $(space),$(comma),$(strip $(MS))))

advise: setup
	$(PY) -m analysis advise $(call quote,$(RUN)) --ms $(call quote,$(subst $(space),$(comma),$(strip $(MS)))) \
	  $(if $(strip $(MEMORY_MB)),--memory-mb $(call quote,$(MEMORY_MB)))

diff: setup
	$(PY) -m analysis diff $(call quote,$(A)) $(call quote,$(B)) $(if $(strip $(FAIL_ON)),--fail-on $(call quote,$(FAIL_ON)))

hta: .venv/.installed-hta
	$(PY) -m analysis hta $(call quote,$(RUN))

report: setup
	$(PY) -m analysis report --traces $(call quote,$(TRACES))

bench: setup-dev
	$(PY) -m bench $(BENCH_ARGS)

# Headless Chromium for the report's browser test (Debian's package); the test skips, saying why,
# where it cannot be installed.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || \
	  echo "warning: chromium not installed; the browser test will be skipped"; }

lint: setup-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: setup-dev browser
	$(PY) -m pytest -q

fuzz: setup-dev
	FUZZ_EXAMPLES=20000 $(PY) -m pytest -q tests -k fuzz

# reports/ is the report's own folder (it lists its files in reports/.report-files.json and refuses a
# folder holding others), so it goes whole.
clean:
	find traces -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
	rm -rf reports

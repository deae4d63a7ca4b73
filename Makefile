# A newcomer runs `make demo` and `make test`; both set up .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PACKAGES := package protos simulator compiler policy daemon client client/api client/door client/modes client/core client/distributed cli

.PHONY: setup door redis-server test test-slow soak lint protos explain demo bench conformance zoo zoo-invariant sweep clean

setup: $(STAMP) door redis-server

# trnsim's C++ parts, built once per source and torch version (g++ and ninja): the simulated
# core's allocator and timeline (simulator/native.cpp, ~/.cache/trnsim/native, about 15 s),
# which trnsim cannot run without, and the C++ door (client/door/fast_door.cpp,
# ~/.cache/trnsim/door, about 40 s).
door: $(STAMP)
	@$(PY) -m trnsim.simulator.native
	@$(PY) -c 'from trnsim.client.door import fast; fast.main()'

# The cluster tier's tests start their own Redis server: Debian's, installed when missing
# (as root, as here; anyone else is told the command).
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q redis-server >/dev/null 2>&1 || \
	     { apt-get update -q >/dev/null && apt-get install -y -q redis-server >/dev/null; }) && \
	    echo "installed redis-server (Debian's) for the cluster tier's tests"; \
	  else echo "redis-server is missing: sudo apt-get install redis-server" >&2; exit 1; fi; }

# Strict editable mode makes mypy resolve the mapped trnsim.* packages (setuptools' strict editable install);
# it links files at install time, so the install re-runs when a package folder gains or
# loses a file (the folder's mtime changes) or a .proto changes.
$(STAMP): pyproject.toml protos/*.proto $(addsuffix /.,$(PACKAGES))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch pinned on the same command line as everything else: the CPU build on this
	# machine's disk, which no test library (transformers...) can replace with a CUDA download.
	$(PY) -m pip install --quiet torch==2.13.0 -e '.[test]' --config-settings editable_mode=strict
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -m trnsim -p trnsim.simulator -p trnsim.compiler -p trnsim.policy -p trnsim.daemon -p trnsim.client -p trnsim.cli

test: lint
	$(PY) -m pytest -q -m "not slow and not soak"

# The whole OpInfo database (eager and adaptive), the whole model zoo, and thousands of
# fuzzer programs; the statistics say how many programs ran.
test-slow: setup
	$(PY) -m pytest -q -m slow --hypothesis-show-statistics

# The daemon under load: a long wire fuzz and 64 client processes for 30 s (p50/p99 printed).
soak: setup
	$(PY) -m pytest -q -s -m soak tests/daemon

protos: setup
	$(PY) protos/generate.py

explain: setup
	$(PY) -m trnsim.compiler --explain examples/graphs/mlp.json

# The main demo: a small GPT trained on the simulated chip next to the same on CPU, cold, then
# warm after `trnsim precompile` of what the cold run recorded.
DEMO_GRAPHS ?= $(or $(XDG_RUNTIME_DIR),/tmp)/trnsim-demo.graphs
# CPU, neuron eager and neuron adaptive side by side. Compiles go through the host's compile
# daemon (started on first use); its stats close the demo.
demo: setup
	@echo "== 1. the first run: every executable compiled now, graphs recorded (NEURON_RECORD_GRAPHS)"
	rm -f $(DEMO_GRAPHS)
	NEURON_RECORD_GRAPHS=$(DEMO_GRAPHS) $(PY) examples/train_gpt.py --steps 20
	@echo "== 2. compile ahead what it recorded, through the daemon"
	$(VENV)/bin/trnsim precompile $(DEMO_GRAPHS)
	@echo "== 3. the same run, warm: nothing compiled, adaptive mode fuses from its first steps"
	$(PY) examples/train_gpt.py --steps 20
	$(VENV)/bin/trnsim stats

bench: setup
	$(PY) benchmarks/host.py
	$(PY) benchmarks/dispatch.py
	$(PY) benchmarks/daemon.py
	NEURON_COMPILE_DAEMON=off $(PY) benchmarks/modes.py

# Every zoo model (tests/zoo) trained on CPU, neuron eager and neuron adaptive, one process per
# model, two at a time: a table of eager and adaptive against CPU and adaptive against eager;
# then the transformers sweep's representative set (every trait the sweep saw, docs/SWEEP.md).
zoo: setup
	$(PY) tests/zoo/zoo.py
	$(PY) tests/sweep/sweep.py --representative --rerun --strict

# Every model type of the installed transformers, shrunk and trained in every mode (docs/SWEEP.md,
# docs/validation.md): sharded over SWEEP_JOBS processes, resumable (results cached per target,
# keyed by the commit and the transformers version); op signatures recorded into the sweep's
# registry, which is then tested whole.
SWEEP_JOBS ?= 2
SWEEP_REGISTRY := tests/registry/sweep.jsonl.gz
sweep: setup
	$(PY) tests/sweep/sweep.py --jobs $(SWEEP_JOBS) --record $(SWEEP_REGISTRY) --report docs/SWEEP.md
	$(VENV)/bin/trnsim registry test $(SWEEP_REGISTRY)

# Shape-only mode (NEURON_SIM_NUMERICS=off) against numerics on, every zoo model and mode:
# the same simulated time, launches, executables and HBM (docs/shape-only.md).
zoo-invariant: setup
	$(PY) tests/zoo/invariant.py

# All of PyTorch's OpInfo float32 samples on neuron vs CPU (about half an hour).
conformance: setup
	$(PY) tests/conformance.py

clean:
	rm -rf $(VENV) build *.egg-info protos/*_pb2*.py protos/*_pb2*.pyi

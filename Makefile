# slurm-dispatch: the commands a newcomer runs.
PYTHON ?= python3

.PHONY: demo demo-protocol test check bench install

install:
	$(PYTHON) -m pip install -q -e '.[test]'

# The seed's scenario on a real multi-node Slurm sandbox (needs root: installs slurm-wlm, munge).
demo: install
	bash demo/cluster.sh

# The checkpoint protocol alone, no Slurm: two overlapping executions on this machine.
demo-protocol: install
	bash demo/protocol.sh

test: install
	$(PYTHON) -m pytest -q

check:
	ruff check slurm_dispatch tests bench
	mypy slurm_dispatch

bench: install
	$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) bench/bench_store.py
	$(PYTHON) bench/bench_supervisor.py
	@for b in bench/bench_sbatch.py bench/bench_hooks.py; do \
		if [ -f $$b ]; then $(PYTHON) $$b || exit 1; fi; done

# slurm-dispatch: the commands a newcomer runs.
PYTHON ?= python3

.PHONY: demo test check bench install

install:
	$(PYTHON) -m pip install -q -e '.[test]'

demo: install
	bash demo/protocol.sh

test: install
	$(PYTHON) -m pytest -q

check:
	ruff check slurm_dispatch tests bench
	mypy slurm_dispatch

bench: install
	$(PYTHON) bench/bench_store.py

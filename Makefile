# slurm-dispatch: the commands a newcomer runs.
PYTHON ?= python3

.PHONY: demo demo-protocol test test-fast check bench install dist

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

# The fast tier for iteration: unit tests and fakes at the process boundary, no real cluster.
test-fast: install
	$(PYTHON) -m pytest -q -m "not real" --ignore=tests/real

check:
	ruff check slurm_dispatch tests bench
	mypy slurm_dispatch

bench: install
	$(PYTHON) -m pip install -q -e '.[bench]'
	$(PYTHON) bench/bench_store.py
	$(PYTHON) bench/bench_supervisor.py
	@for b in bench/bench_sbatch.py bench/bench_hooks.py; do \
		if [ -f $$b ]; then $(PYTHON) $$b || exit 1; fi; done

# What a site installs from: the wheel (nodes, controller, login nodes: pip install it into a
# venv) and the admin's parts (hook scripts, config templates, the admin guide) in one tarball.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
dist:
	rm -rf dist
	$(PYTHON) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	tar -czf dist/slurm-dispatch-site-$(VERSION).tar.gz --transform 's,^,slurm-dispatch-site-$(VERSION)/,' contrib site-config docs/admin-guide.md
	@ls -l dist

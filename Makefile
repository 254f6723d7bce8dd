# slurm-dispatch: the commands a newcomer runs.
PYTHON ?= python3

.PHONY: demo demo-protocol test test-fast check bench install install-test dist

install:
	$(PYTHON) -m pip install -q -e .

# What the tests use: the test tools, boto3 and the S3 server, and the training libraries for the
# integrations' tests.  torch first, pinned to the CPU build (a bare `torch` may pull a CUDA
# build of several GB); the extras' torch range admits it.
install-test:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q 'torch==2.13.0'
	$(PYTHON) -m pip install -q -e '.[test,transformers,lightning]'

# The seed's scenario on a real multi-node Slurm sandbox (needs root: installs slurm-wlm, munge).
demo: install
	bash demo/cluster.sh

# The checkpoint protocol alone, no Slurm: two overlapping executions on this machine.
demo-protocol: install
	bash demo/protocol.sh

test: install-test
	$(PYTHON) -m pytest -q

# The fast tier for iteration: unit tests and fakes at the process boundary, no real cluster.
test-fast: install-test
	$(PYTHON) -m pytest -q -m "not real" --ignore=tests/real

check:
	ruff check slurm_dispatch tests bench
	mypy slurm_dispatch

bench: install-test
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

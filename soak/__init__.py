"""The soak: a workload of dispatch jobs on the real sandbox, a nemesis, and a checker.

``history.py`` is what each trainer writes, ``checker.py`` reads a finished run's folder and
counts each invariant's violations, ``run.py`` drives the workload and the nemesis
(``make soak``).  Nothing in ``slurm_dispatch`` imports this package.
"""

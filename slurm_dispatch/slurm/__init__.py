"""The one adapter between slurm-dispatch and Slurm: no module outside this package runs
``squeue``, ``scontrol``, ``sacct`` or ``sbatch``, or imports pyslurm.

:mod:`.adapter` holds the typed views of jobs and nodes, the job-state vocabulary, the retries
and the choice of backend; :mod:`.select` chooses pyslurm or the command-line tools;
:mod:`.pyslurm_backend` is the libslurm way; :mod:`.hostlist` reads Slurm's host lists (standard
library only: the hooks use it).  Imports nothing at import time.
"""

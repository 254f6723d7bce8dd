"""Inside the job: one execution of a dispatch job.  The launcher every batch script runs
(:mod:`.launch`; ``python -m slurm_dispatch.launch`` is its permanent name), which names are
saves and when a save is complete (:mod:`.saverules`), ``dispatch watch`` (:mod:`.watch`,
:mod:`.watch_s3`), ``dispatch fetch`` and the staging folder of an ``s3://`` root
(:mod:`.fetch`, :mod:`.stage`).  The framework callbacks are in
:mod:`slurm_dispatch.integrations`.  Imports nothing here, and none of it loads the control
side's supervisor or status.
"""

"""The control side, on the login node, as the job's own user: a dispatch job across its
submissions.  Its record and events (:mod:`.record`, :mod:`.events`), the sbatch grammar and
batch script (:mod:`.sbatch_args`), submission (:mod:`.submit`, :mod:`.dependency`,
:mod:`.plan`), the recovery rules and the supervisor that applies them (:mod:`.rules`,
:mod:`.supervisor`, :mod:`.heartbeat`), and what people read (:mod:`.status`,
:mod:`.timeline`, :mod:`.forget`).  Imports nothing here.
"""

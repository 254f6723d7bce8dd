"""Node and controller facts, for readers: one import for everything the hooks record.

Which is which: this module is the readers' one import and holds no code of its own; the
store itself (how a fact is named, written once and read back trusted) is
:mod:`slurm_dispatch.node.factstore`, which the hooks import directly.  The ideas live in
their own modules; this one re-exports them so that readers (``cease``, ``status``) keep one
name to import:

* :mod:`slurm_dispatch.node.factstore`: the no-follow fact store (names, the JSON encoder, writing
  and trusted reading, format versions);
* :mod:`slurm_dispatch.node.procscan`: the survivor scan over /proc (and a job's cgroup);
* :mod:`slurm_dispatch.slurm.hostlist`: Slurm host lists to node names;
* :mod:`slurm_dispatch.node.executions`: facts grouped into executions of a job.

Invariant: standard library only.  The hooks import the modules they need directly, not this
one, so a Prolog does not pay for the scan.
"""

from __future__ import annotations

from ..errors import FactError
from ..slurm.hostlist import expand_hostlist
from .executions import collect, execution_facts, group_executions
from .factstore import (
    FACTS,
    FORMAT_VERSION,
    KINDS,
    MAX_FACT_BYTES,
    WATCH,
    array_starts,
    array_task_job,
    boot_id,
    boot_time,
    check_name,
    dumps,
    fact_uids,
    job_uids,
    list_job,
    new_token,
    node_activity,
    open_state_dir,
    parse_name,
    read_job_facts,
    write_fact,
)
from .procscan import ancestors, scan_survivors

__all__ = [
    "FACTS",
    "FORMAT_VERSION",
    "FactError",
    "KINDS",
    "MAX_FACT_BYTES",
    "WATCH",
    "ancestors",
    "array_starts",
    "array_task_job",
    "boot_id",
    "boot_time",
    "check_name",
    "collect",
    "dumps",
    "execution_facts",
    "expand_hostlist",
    "fact_uids",
    "group_executions",
    "job_uids",
    "list_job",
    "new_token",
    "node_activity",
    "open_state_dir",
    "parse_name",
    "read_job_facts",
    "scan_survivors",
    "write_fact",
]

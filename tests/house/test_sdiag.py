"""The readings of the controller's and slurmdbd's own counters (tests/sdiag.py) find every
user, whatever the length of the name: ``sdiag`` prints a user as ``%-16s(%8u)`` and
``sacctmgr show stats`` as ``%-20s(%10u)``, so a name that fills the column touches the
parenthesis (the real tier's xdist users, ``dispatchuser-gw1``, are 16 characters)."""

from __future__ import annotations

from tests import sdiag

SDIAG = """\
Remote Procedure Call statistics by message type
\tREQUEST_JOB_USER_INFO                   ( 2039) count:1      ave_time:168    total_time:168
\tREQUEST_PARTITION_INFO                  ( 2009) count:1      ave_time:50     total_time:50

Remote Procedure Call statistics by user
\troot            (       0) count:4      ave_time:90     total_time:360
\tdispatchuser-gw1(    1013) count:3      ave_time:229    total_time:689
\tdsu-bill        (    1002) count:2      ave_time:10     total_time:20
\ta-name-longer-than-its-column(    1003) count:5      ave_time:1      total_time:5

Pending RPC statistics
\tNo pending RPCs
"""

SACCTMGR = """\
Remote Procedure Call statistics by message type
\tDBD_STEP_START           ( 1442) count:2      ave_time:300    total_time:600

Remote Procedure Call statistics by user
\tdispatchuser-gw1-slurmdbd(      1013) count:7      ave_time:3      total_time:21
"""


def test_a_user_whose_name_fills_the_column_is_counted() -> None:
    found = sdiag.parse(SDIAG)
    assert found.by_user == {
        "root": (4, 360),
        "dispatchuser-gw1": (3, 689),
        "dsu-bill": (2, 20),
        "a-name-longer-than-its-column": (5, 5),
    }
    assert found.by_type == {"REQUEST_JOB_USER_INFO": (1, 168), "REQUEST_PARTITION_INFO": (1, 50)}


def test_slurmdbds_table_is_read_alike() -> None:
    found = sdiag.parse(SACCTMGR)
    assert found.by_user == {"dispatchuser-gw1-slurmdbd": (7, 21)}
    assert found.by_type == {"DBD_STEP_START": (2, 600)}

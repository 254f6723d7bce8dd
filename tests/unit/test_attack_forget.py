"""Attack: `dispatch forget --before` as an unlucky user types it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_dispatch.cli import dispatch as cli
from slurm_dispatch.control.supervisor import Settings, Supervisor
from slurm_dispatch.errors import RecordError
from slurm_dispatch.slurm.adapter import Slurm

from ..fakes.cluster import FakeCluster
from .test_jobs_cancel import cluster, submit_one  # noqa: F401 - the fixture


def test_a_bad_before_names_before_not_since() -> None:
    done = CliRunner().invoke(cli.main, ["forget", "--before", "yesterday"])
    assert done.exit_code == 2
    assert "--before 'yesterday' is not a time" in done.stderr, done.stderr
    assert "--since" not in done.stderr


def test_a_before_in_the_future_forgets_nothing(cluster: FakeCluster) -> None:  # noqa: F811
    # now+30days for now-30days: one wrong sign would forget every settled job, however new.
    done = submit_one("ck-a")
    cluster.set(done.slurm_job_id, JobState="COMPLETED")
    Supervisor(Slurm(), Settings()).run_pass()
    del cluster.jobs[done.slurm_job_id]
    refused = CliRunner().invoke(cli.main, ["forget", "--before", "now+30days"])
    assert refused.exit_code == 2, refused.output
    assert "--before 'now+30days' is in the future" in refused.stderr, refused.stderr
    assert os.path.isdir(done.job.path)


def test_now_alone_is_a_time_as_sacct_reads_it() -> None:
    assert cli.parse_since("now", 1000.0) == 1000.0
    assert cli.parse_since("NOW", 1000.0) == 1000.0


def test_a_record_whose_created_is_not_a_number_does_not_stop_forget(cluster: FakeCluster) -> None:  # noqa: F811
    # Attack: job.json's "created" as text (a hand edit, a tool of the user's) made
    # last_activity raise ValueError, so `dispatch forget --before` ended in a traceback and
    # dispatch-admin prune's child for that user failed on every run, pruning none of them.
    import json

    odd, plain = submit_one("ck-odd"), submit_one("ck-plain")
    for done in (odd, plain):
        cluster.set(done.slurm_job_id, JobState="COMPLETED")
    Supervisor(Slurm(), Settings()).run_pass()
    for done in (odd, plain):
        del cluster.jobs[done.slurm_job_id]
    spec_path = os.path.join(odd.job.path, "job.json")
    with open(spec_path) as handle:
        spec = json.load(handle)
    spec["created"] = "abc"
    with open(spec_path, "w") as handle:
        json.dump(spec, handle)
    forgot = CliRunner().invoke(cli.main, ["forget", "--before", "now"])
    assert forgot.exception is None or isinstance(forgot.exception, SystemExit), forgot.exception
    assert forgot.exit_code == 0, (forgot.output, forgot.stderr)
    assert not os.path.exists(plain.job.path)
    # Its events still say when it was last active: it is judged by them, and forgotten too.
    assert not os.path.exists(odd.job.path)


def test_dispatch_forget_refuses_a_symlinked_record_and_an_old_leftover_link_goes(
    cluster: FakeCluster, tmp_path: Path
) -> None:  # noqa: F811
    # Attack: jobs/<id> a symlink to a settled record elsewhere was 'forgotten' by
    # renaming the link to .forgetting-<id>-..., which rmtree then could not remove (it does
    # not remove a symlink), so every later run said it finished it, and it stayed.
    from slurm_dispatch.control import forget, record

    done = submit_one("ck-link")
    cluster.set(done.slurm_job_id, JobState="COMPLETED")
    Supervisor(Slurm(), Settings()).run_pass()
    del cluster.jobs[done.slurm_job_id]
    target = tmp_path / "moved" / done.job.id
    target.parent.mkdir()
    os.rename(done.job.path, target)
    os.symlink(target, done.job.path)
    refused = CliRunner().invoke(cli.main, ["forget", done.job.id])
    assert refused.exit_code == 1, (refused.output, refused.stderr)
    assert f"{done.job.id} stays: a symlink to {str(target)!r}" in refused.stderr, refused.stderr
    assert os.path.islink(done.job.path) and (target / "job.json").is_file()
    with pytest.raises(RecordError, match="a symlink to"):
        forget.forget(record.JobRecord(done.job.path))
    assert os.path.islink(done.job.path)
    # What an earlier release left: the link renamed out of sight.  The link alone goes.
    left = os.path.join(record.jobs_dir(), f"{forget.GOING}{done.job.id}-0badcafe")
    os.rename(done.job.path, left)
    assert forget.finish_earlier() == ([os.path.basename(left)], [])
    assert not os.path.lexists(left) and (target / "job.json").is_file()
    assert forget.finish_earlier() == ([], [])

"""``api.submit``: dispatch-sbatch's submission from Python, against the fake controller at the
process boundary (the sbatch, squeue and scancel it would run): the same record, the same sbatch
line and the same refusals as the command, as exceptions naming the bad value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pytest

from slurm_dispatch import api
from slurm_dispatch.checkpoint import model
from slurm_dispatch.control import environment, record, root_setup, submit
from slurm_dispatch.errors import SlurmError, UsageError
from slurm_dispatch.slurm.adapter import Slurm
from slurm_dispatch.slurm.result import Result

from ..fakes.cluster import FakeCluster


@pytest.fixture
def home(home: Path) -> Path:
    """tests/unit/conftest.py's, its job.sh asking for one node."""
    (home / "job.sh").write_text("#!/bin/bash\n#SBATCH -N 1\necho hi\n")
    return home


class Recording(FakeCluster):
    """The fake controller, keeping the environment and folder each call ran with."""

    def __init__(self) -> None:
        super().__init__()
        self.envs: list[dict[str, str]] = []
        self.cwds: list[Optional[str]] = []

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        self.envs.append(dict(env or {}))
        self.cwds.append(cwd)
        return super().__call__(argv, env, cwd, timeout)


def comparable(job: record.JobRecord, argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """A job's spec and sbatch line without what differs between any two submissions (its id,
    when it was made)."""
    spec = {k: v for k, v in job.spec.items() if k not in ("id", "created")}
    return spec, [w.replace(job.id, "<job>") for w in argv]


def test_submit_makes_the_job_dispatch_sbatch_makes(home: Path) -> None:
    cluster = Recording()
    done = api.submit(
        "job.sh",
        "-t",
        "5",
        "--partition=debug",
        args=["a b", "--lr=3"],
        checkpoint="ck",
        resubmit=2,
        warn_before="2:00",
        slurm=Slurm(cluster, wait=0),
    )
    by_cli = submit.submit_new(
        submit.read_request(
            [
                "--checkpoint",
                "ck-cli",
                "--resubmit",
                "2",
                "--warn-before",
                "2:00",
                "-t",
                "5",
                "--partition=debug",
                "job.sh",
                "a b",
                "--lr=3",
            ]
        ),
        Slurm(cluster, wait=0),
    )
    job = record.open_job(done.job)
    spec, argv = comparable(job, cluster.sbatch_calls()[0])
    cli_spec, cli_argv = comparable(by_cli.job, cluster.sbatch_calls()[1])
    assert argv == cli_argv and argv[:3] == ["sbatch", "-t", "5"]
    assert spec == {**cli_spec, "checkpoint": str(home / "ck")}
    assert f"--comment=dispatch:{done.job}/1" in cluster.sbatch_calls()[0]
    assert "--signal=B:USR1@120" in cluster.sbatch_calls()[0]
    assert (done.slurm_job_id, done.submission, done.generation) == ("100", 1, 0)
    assert done.epoch == model.Epoch(0, 1, 0).value
    assert done.checkpoint == str(home / "ck") and (home / "ck").is_dir()
    assert (
        done.record == job.path
        and Path(job.script).read_bytes() == b"#!/bin/bash\n#SBATCH -N 1\necho hi\n"
    )
    assert done.sbatch_output == "Submitted batch job 100\n"
    assert cluster.cwds[0] == str(home), "sbatch runs where the caller is, as the command does"


def test_a_sweep_submits_many_jobs_from_one_process(home: Path) -> None:
    cluster = FakeCluster()
    slurm = Slurm(cluster, wait=0)
    done = [
        api.submit(
            home / "job.sh", args=[f"--lr={i}"], checkpoint=home / "sweep" / str(i), slurm=slurm
        )
        for i in range(30)
    ]
    assert len({d.job for d in done}) == 30
    assert [d.slurm_job_id for d in done] == [str(100 + i) for i in range(30)]
    assert sorted(j.id for j in record.all_jobs()) == sorted(d.job for d in done)
    assert [c[-1] for c in cluster.sbatch_calls()] == [f"--lr={i}" for i in range(30)]


def test_script_arguments_like_dispatch_options_go_to_the_script_without_a_warning(
    home: Path,
) -> None:
    cluster = FakeCluster()  # pytest turns a warning into an error here (filterwarnings)
    done = api.submit(
        "job.sh",
        args=["--resubmit", "3", "--", "-N"],
        checkpoint="ck",
        slurm=Slurm(cluster, wait=0),
    )
    assert cluster.sbatch_calls()[0][-4:] == ["--resubmit", "3", "--", "-N"]
    assert record.open_job(done.job).spec["resubmit"] == 0 and done.warnings == ()


def test_env_is_set_over_the_callers_environment_for_this_job(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KEPT", "1")
    monkeypatch.setenv("SBATCH_PARTITION", "elsewhere")
    cluster = Recording()
    done = api.submit(
        "job.sh",
        checkpoint="ck",
        env={"LR": "0.1", "SBATCH_PARTITION": None},
        slurm=Slurm(cluster, wait=0),
    )
    seen = cluster.envs[cluster.calls.index(cluster.sbatch_calls()[0])]
    assert seen["LR"] == "0.1" and seen["KEPT"] == "1" and "SBATCH_PARTITION" not in seen
    kept = environment.submission_environment(record.open_job(done.job))
    assert kept["LR"] == "0.1" and "SBATCH_PARTITION" not in kept, (
        "every resubmission gets the first submission's environment"
    )
    assert os.environ["SBATCH_PARTITION"] == "elsewhere", "the caller's own is left alone"


def test_array_and_shared_checkpoint_keywords(home: Path) -> None:
    cluster = FakeCluster()
    done = api.submit(
        "job.sh", checkpoint="ck/task%a", array=[0, 1, 2], slurm=Slurm(cluster, wait=0)
    )
    assert "--array=0,1,2" in cluster.sbatch_calls()[0]
    assert record.open_job(done.job).spec["array_tasks"] == [0, 1, 2]
    shared = api.submit(
        "job.sh", checkpoint="shared", shared_checkpoint=True, slurm=Slurm(cluster, wait=0)
    )
    assert record.open_job(shared.job).spec["shared_checkpoint"] is True
    assert "--no-requeue" in cluster.sbatch_calls()[1]


def test_supersede_keyword_raises_the_generation_and_cancels_the_old(home: Path) -> None:
    cluster = FakeCluster()
    slurm = Slurm(cluster, wait=0)
    old = api.submit("job.sh", checkpoint="ck", slurm=slurm)
    new = api.submit("job.sh", supersede=old.job, slurm=slurm)
    assert (new.generation, new.checkpoint, new.epoch) == (
        1,
        old.checkpoint,
        model.Epoch(1, 1, 0).value,
    )
    assert cluster.jobs[old.slurm_job_id]["JobState"] == "CANCELLED"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "no checkpoint root"),
        ({"checkpoint": "ck", "resubmit": -1}, "--resubmit -1"),
        ({"checkpoint": "ck", "resubmit": "3"}, "resubmit='3' is not an int"),
        ({"checkpoint": "ck", "resubmit": True}, "resubmit=True is not an int"),
        ({"checkpoint": "ck", "warn_before": "soon"}, "--warn-before 'soon'"),
        ({"checkpoint": "ck", "warn_before": 0}, "--warn-before '0'"),
        ({"checkpoint": "ck/%j"}, "--checkpoint 'ck/%j'"),
        ({"checkpoint": "ck", "array": "0-3"}, "one root for all 4 tasks"),
        ({"checkpoint": "ck", "array": "x"}, "--array 'x'"),
        ({"checkpoint": "ck", "array": []}, "array=[] names no task"),
        ({"checkpoint": "ck", "env": {"A": 1}}, "env={'A': 1}"),
        ({"checkpoint": "ck", "shared_checkpoint": "no"}, "shared_checkpoint='no' is not a bool"),
        ({"checkpoint": "ck", "args": "--lr 3"}, "args='--lr 3' is one string"),
        (
            {"checkpoint": "ck", "sbatch": ["--checkpoint", "other"]},
            "--checkpoint among the sbatch options: give it as checkpoint=",
        ),
        ({"checkpoint": "ck", "sbatch": ["--plan"]}, "--plan among the sbatch options"),
        (
            {"checkpoint": "ck", "sbatch": ["-N", "2", "train"]},
            "'train' among the sbatch options is not an option",
        ),
        ({"checkpoint": "ck", "sbatch": ["--wrap=hostname"]}, "--wrap is"),
        ({"checkpoint": "ck", "sbatch": ["--", "x"]}, "'--' among the sbatch options"),
        ({"checkpoint": "ck", "sbatch": ["--test-only"]}, "--test-only submits nothing"),
        (
            {"checkpoint": "ck", "sbatch": ["--requeue"], "shared_checkpoint": True},
            "--requeue contradicts --shared-checkpoint",
        ),
        ({"checkpoint": "ck", "script": "missing.sh"}, "cannot read script 'missing.sh'"),
    ],
)
def test_bad_input_is_a_usage_error_naming_the_value_with_nothing_made(
    home: Path, kwargs: dict[str, Any], message: str
) -> None:
    cluster = FakeCluster()
    script = kwargs.pop("script", "job.sh")
    words = kwargs.pop("sbatch", [])
    with pytest.raises(UsageError) as info:
        api.submit(script, *words, slurm=Slurm(cluster, wait=0), **kwargs)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert cluster.sbatch_calls() == [] and record.all_jobs() == []
    assert not (home / "ck").exists()


def test_sbatchs_refusal_is_a_slurm_error_with_its_words_and_nothing_kept(home: Path) -> None:
    def refuse(
        argv: Sequence[str], env: Optional[Mapping[str, str]], cwd: Optional[str], timeout: float
    ) -> Result:
        assert argv[0] == "sbatch", argv
        return Result(list(argv), 1, "", "sbatch: error: invalid partition specified: nope\n")

    with pytest.raises(SlurmError) as info:
        api.submit("job.sh", "-p", "nope", checkpoint="ck", slurm=Slurm(refuse, wait=0))
    assert info.value.returncode == 1
    assert "invalid partition specified: nope" in info.value.output
    assert record.all_jobs() == [] and not (home / "ck").exists()


def test_a_root_in_use_by_a_live_job_is_refused_naming_it(home: Path) -> None:
    cluster = FakeCluster()
    first = api.submit("job.sh", checkpoint="ck", slurm=Slurm(cluster, wait=0))
    with pytest.raises(UsageError, match=f"in use by your dispatch job {first.job}"):
        api.submit("job.sh", checkpoint="ck", slurm=Slurm(cluster, wait=0))


def test_submission_is_a_readable_value(home: Path) -> None:
    done = api.submit("job.sh", checkpoint="ck", slurm=Slurm(FakeCluster(), wait=0))
    assert repr(done).startswith(f"Submission(job='{done.job}', slurm_job_id='100'")
    with pytest.raises(AttributeError):
        done.job = "other"  # type: ignore[misc]


def test_submitting_imports_no_click() -> None:
    code = (
        "import sys, slurm_dispatch.api, slurm_dispatch.control.submit, "
        "slurm_dispatch.slurm.adapter; "
        "print(','.join(m for m in ('click', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ""


def test_a_sweep_reads_each_record_once_for_the_root_in_use_check(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check lists the caller's records at every submission; a record's spec never
    changes once written, so one process reads each once (linear, not quadratic, in jobs)."""
    reads: list[str] = []
    real = record.read_json

    def counted(path: str) -> Any:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(record, "read_json", counted)
    slurm = Slurm(FakeCluster(), wait=0)
    done = [api.submit("job.sh", checkpoint=f"sweep/{i}", slurm=slurm) for i in range(40)]
    specs = [p for p in reads if p.endswith("job.json")]
    assert len(specs) <= 3 * len(done), f"{len(specs)} reads of job.json for {len(done)} jobs"
    with pytest.raises(UsageError, match=f"in use by your dispatch job {done[7].job}"):
        api.submit("job.sh", checkpoint="sweep/7", slurm=slurm)


def test_a_record_made_again_under_its_id_is_read_again(home: Path) -> None:
    slurm = Slurm(FakeCluster(), wait=0)
    first = api.submit("job.sh", checkpoint="a", slurm=slurm)
    spec = Path(first.record, "job.json")
    text = spec.read_text().replace(str(home / "a"), str(home / "b"))
    spec.chmod(0o644)
    spec.unlink()
    spec.write_text(text)
    with pytest.raises(UsageError, match=f"in use by your dispatch job {first.job}"):
        api.submit("job.sh", checkpoint="b", slurm=slurm)
    assert api.submit("job.sh", checkpoint="a", slurm=slurm).job != first.job


def test_the_user_guides_example_submits_its_sweep(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "user-guide.md").read_text()
    section = guide.split("\n## Submitting from Python\n", 1)[1].split("\n## ", 1)[0]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    (home / "train.sh").write_text('#!/bin/bash\npython3 train.py "$@"\n')
    cluster = Recording()
    monkeypatch.setattr(api, "_ADAPTER", [Slurm(cluster, wait=0)])  # the process's adapter
    exec(compile(example, "user-guide.md", "exec"), {})
    jobs = {j.spec["checkpoint"]: j for j in record.all_jobs()}
    assert sorted(jobs) == [str(home / "sweep" / f"lr{lr}") for lr in ("1e-3", "1e-4", "3e-4")]
    assert [c[-2:] for c in cluster.sbatch_calls()] == [
        ["--lr", lr] for lr in ("1e-4", "3e-4", "1e-3")
    ]
    assert environment.submission_environment(jobs[str(home / "sweep" / "lr3e-4")])["LR"] == "3e-4"


def test_cwd_is_where_the_script_and_root_are_found_and_sbatch_runs(home: Path) -> None:
    other = home / "project"
    other.mkdir()
    (other / "run.sh").write_text("#!/bin/bash\necho run\n")
    cluster = Recording()
    done = api.submit("run.sh", checkpoint="ck", cwd=other, slurm=Slurm(cluster, wait=0))
    assert done.checkpoint == str(other / "ck") and (other / "ck").is_dir()
    assert cluster.cwds[cluster.calls.index(cluster.sbatch_calls()[0])] == str(other)
    assert record.open_job(done.job).spec["cwd"] == str(other)
    with pytest.raises(UsageError, match="cannot read script 'job.sh'"):
        api.submit("job.sh", checkpoint="ck2", cwd=other, slurm=Slurm(cluster, wait=0))


def test_a_sweep_may_submit_from_threads_each_job_on_its_own_root(home: Path) -> None:
    """sbatch's answer is most of a submission's time, so a sweep overlaps them from a thread
    pool: every job is recorded once, with its own submission, marker and batch script."""
    from concurrent.futures import ThreadPoolExecutor

    cluster = FakeCluster()
    slurm = Slurm(cluster, wait=0)
    with ThreadPoolExecutor(8) as pool:
        done = list(
            pool.map(
                lambda i: api.submit("job.sh", args=[str(i)], checkpoint=f"sweep/{i}", slurm=slurm),
                range(40),
            )
        )
    assert len({d.job for d in done}) == len({d.slurm_job_id for d in done}) == 40
    for i, d in enumerate(done):
        job = record.open_job(d.job)
        assert [s["slurm_job_id"] for s in job.submissions()] == [d.slurm_job_id]
        call = next(c for c in cluster.sbatch_calls() if f"--comment=dispatch:{d.job}/1" in c)
        assert call[-2:] == [job.batch_script(1), str(i)]
        assert cluster.jobs[d.slurm_job_id]["Comment"] == f"dispatch:{d.job}/1"
        assert job.spec["checkpoint"] == str(home / "sweep" / str(i))


class HeldSbatch(FakeCluster):
    """The fake controller, whose first sbatch answers only once ``go`` is set (a submission
    caught between its record and its Slurm job)."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = __import__("threading").Event()
        self.go = __import__("threading").Event()

    def __call__(
        self,
        argv: Sequence[str],
        env: Optional[Mapping[str, str]],
        cwd: Optional[str],
        timeout: float,
    ) -> Result:
        if argv[0] == "sbatch" and not self.inside.is_set():
            self.inside.set()
            assert self.go.wait(30), "the test never let the first sbatch answer"
        return super().__call__(argv, env, cwd, timeout)


def test_a_root_being_submitted_by_another_thread_is_refused(home: Path) -> None:
    """Two simultaneous submissions on one root: the second found the first's record with no
    submission yet, took the root for free and both ran on it."""
    from concurrent.futures import ThreadPoolExecutor

    cluster = HeldSbatch()
    slurm = Slurm(cluster, wait=0)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(api.submit, "job.sh", checkpoint="ck", slurm=slurm)
        assert cluster.inside.wait(30)
        try:
            with pytest.raises(UsageError, match="is being submitted by your dispatch job"):
                api.submit("job.sh", checkpoint="ck", slurm=slurm)
        finally:
            cluster.go.set()
        done = first.result(30)
    assert [j.id for j in record.all_jobs()] == [done.job]
    assert len(cluster.sbatch_calls()) == 1


def test_two_submissions_that_both_checked_before_either_was_recorded_never_both_run(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both looked at the root before either had a record: each checks again once its own
    record exists, so the second to check gives way (both may, never neither)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    both = threading.Barrier(2, timeout=30)
    real = submit.prepare_root

    def meet_then_prepare(root: str) -> list[str]:  # both are past the first look
        both.wait()
        return real(root)

    monkeypatch.setattr(submit, "prepare_root", meet_then_prepare)
    cluster = FakeCluster()
    slurm = Slurm(cluster, wait=0)
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(api.submit, "job.sh", checkpoint="ck", slurm=slurm) for _ in range(2)
        ]
        outcomes = [f.exception(30) or f.result() for f in futures]
    refused = [o for o in outcomes if isinstance(o, UsageError)]
    kept = [o for o in outcomes if isinstance(o, api.Submission)]
    assert len(kept) <= 1 and len(refused) + len(kept) == 2, outcomes
    # The one refused saw the other's record either before its sbatch or after (a loaded
    # machine lets the other finish first): both name the root and the other job.
    assert all(
        re.search(
            r"checkpoint root '.*ck' is (being submitted by|in use by) your "
            r"dispatch job \S+",
            str(r),
        )
        for r in refused
    ), refused
    assert [j.id for j in record.all_jobs()] == [k.job for k in kept]
    assert len(cluster.sbatch_calls()) == len(kept)


def test_a_record_left_without_a_submission_long_ago_does_not_hold_its_root(home: Path) -> None:
    """A submission killed between its record and sbatch leaves a record with no submission:
    it holds the root for BEING_SUBMITTED_FOR only."""
    import time

    spec = {
        "checkpoint": str(home / "ck"),
        "created": time.time() - root_setup.BEING_SUBMITTED_FOR - 1,
    }
    record.create_job(spec, b"#!/bin/bash\n")
    done = api.submit("job.sh", checkpoint="ck", slurm=Slurm(FakeCluster(), wait=0))
    assert done.slurm_job_id == "100"
    record.create_job(
        {**spec, "checkpoint": str(home / "ck2"), "created": time.time()}, b"#!/bin/bash\n"
    )
    with pytest.raises(UsageError, match="ck2' is being submitted by your dispatch job"):
        api.submit("job.sh", checkpoint="ck2", slurm=Slurm(FakeCluster(), wait=0))
    assert not any(
        j.spec.get("script_name") for j in record.all_jobs() if j.spec["checkpoint"].endswith("ck2")
    )


def test_a_dispatch_lines_root_expands_from_the_environment_given(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script's `#DISPATCH --checkpoint ck/$RUN` expands from the environment the job is
    submitted with (env=, over the caller's), as sbatch sees it; it read the caller's own, so
    RUN given in env= was 'not set' (or the caller's RUN taken)."""
    monkeypatch.delenv("RUN", raising=False)
    (home / "job2.sh").write_text("#!/bin/bash\n#DISPATCH --checkpoint ck/$RUN\necho hi\n")
    done = api.submit("job2.sh", env={"RUN": "r1"}, slurm=Slurm(FakeCluster(), wait=0))
    assert record.open_job(done.job).spec["checkpoint"] == str(home / "ck" / "r1")
    monkeypatch.setenv("RUN", "callers")
    done = api.submit("job2.sh", env={"RUN": "r2"}, slurm=Slurm(FakeCluster(), wait=0))
    assert record.open_job(done.job).spec["checkpoint"] == str(home / "ck" / "r2")

"""A publication whose answer was lost (issue 17, item 12), against a real SeaweedFS server
behind a proxy that lets the server apply the conditional PutObject and then drops its answer:
botocore retries, meets 412, and the publication is still this call's own.  And the same name
published earlier by another call: the store says so (AlreadyPublished), ``dispatch publish``
says "already published" and exits 0 on both stores, and the integrations carry on.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import AlreadyPublished
from tests.s3server import SeaweedServer

from .faulty_proxy import FaultyProxy

E1 = model.Epoch(0, 1, 0).value
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-c", "from slurm_dispatch.cli.dispatch import main; main()"]

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]


def pub_puts(proxy: FaultyProxy) -> list[int]:
    """The status answered to each PutObject of a publication (0: the answer was dropped)."""
    return [status for method, path, status in proxy.seen if method == "PUT" and "/pub/" in path]


@contextlib.contextmanager
def first_publication_answer_dropped(server: SeaweedServer, monkeypatch: pytest.MonkeyPatch
                                     ) -> Iterator[FaultyProxy]:
    """boto3 talks to the server through a proxy that drops the answer to the first PutObject
    of a publication once the server has applied it."""
    with FaultyProxy(server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.drop_answer_next("PUT", "/pub/")
        yield proxy


def test_a_publication_whose_answer_was_lost_is_returned_as_made(
        s3_env: SeaweedServer, s3_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    save = s3_root + "/exec/a/c5"
    with first_publication_answer_dropped(s3_env, monkeypatch) as proxy:
        name = store.publish(s3_root, E1, 5, save)
        # The server made it, its answer never came; botocore's retry met 412.
        assert pub_puts(proxy) == [0, 412]
        assert name == model.format_name(E1, 5, "exec/a/c5")
        assert [(f.epoch, f.step, f.path) for f in store.list_publications(s3_root)] == \
            [(E1, 5, save)]
        # Another call publishing the same name finds it there before it: that is said.
        with pytest.raises(AlreadyPublished, match=name + r".*before this call"):
            store.publish(s3_root, E1, 5, save)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60,
                          cwd=REPO)


def test_dispatch_publish_with_a_lost_answer_prints_the_name_and_exits_0(
        s3_env: SeaweedServer, s3_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    save = s3_root + "/exec/a/c7"
    with first_publication_answer_dropped(s3_env, monkeypatch) as proxy:
        done = run_cli("publish", "--root", s3_root, "--epoch", str(E1), "--step", "7", save)
        assert pub_puts(proxy) == [0, 412]
    assert (done.returncode, done.stdout) == (0, model.format_name(E1, 7, "exec/a/c7") + "\n")
    assert done.stderr == ""


@pytest.mark.parametrize("kind", ["posix", "s3"])
def test_dispatch_publish_of_a_name_already_there_says_so_and_exits_0(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "s3":
        root = request.getfixturevalue("s3_root")
        save = root + "/exec/a/c9"
    else:
        root = str(tmp_path / "root")
        save = f"{root}/exec/a/c9"
        Path(save).mkdir(parents=True)
    name = model.format_name(E1, 9, "exec/a/c9")
    args = ("publish", "--root", root, "--epoch", str(E1), "--step", "9", save)
    first = run_cli(*args)
    assert (first.returncode, first.stdout, first.stderr) == (0, name + "\n", "")
    again = run_cli(*args)
    assert (again.returncode, again.stdout) == (0, name + "\n")
    assert "already published" in again.stderr and name in again.stderr
    assert "nothing to do" in again.stderr
    assert [f.step for f in store.list_publications(root)] == [9]


# ---- the integrations: a lost answer, and a name already there, end no training ----------

@contextlib.contextmanager
def first_answer_lost(server: SeaweedServer, root: str, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An execution on ``root`` whose first publication's answer is dropped; on leaving, the
    answers were: dropped, 412 to botocore's retry, then 200 for the next save."""
    from .test_integrations_s3 import dispatch_env

    dispatch_env(root, tmp_path, "a" * 26, E1, "", monkeypatch)
    with first_publication_answer_dropped(server, monkeypatch) as proxy:
        yield
        assert pub_puts(proxy) == [0, 412, 200]


def test_hf_on_s3_carries_on_when_a_publications_answer_is_lost(
        s3_env: SeaweedServer, s3_root: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import make_trainer

    from .test_integrations_s3 import published

    exec_dir = f"{s3_root}/exec/{'a' * 26}"
    with first_answer_lost(s3_env, s3_root, tmp_path, monkeypatch):
        callback = DispatchCallback()
        trainer = make_trainer(tmp_path / "out", 4, [callback])
        trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    assert trainer.state.global_step == 4
    assert published(s3_root) == [(E1, s, f"{exec_dir}/checkpoint-{s}") for s in (2, 4)]
    assert callback.publications == [model.format_name(E1, s, f"exec/{'a' * 26}/checkpoint-{s}")
                                     for s in (2, 4)]


def test_lightning_on_s3_carries_on_when_a_publications_answer_is_lost(
        s3_env: SeaweedServer, s3_root: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_lightning import fit

    from .test_integrations_s3 import published

    exec_dir = f"{s3_root}/exec/{'a' * 26}"
    with first_answer_lost(s3_env, s3_root, tmp_path, monkeypatch):
        trainer, _model = fit(tmp_path, 4, [ModelCheckpoint(every_n_train_steps=2, save_top_k=-1),
                                            DispatchCallback()],
                              ckpt_path=resume_from_checkpoint())
    assert trainer.global_step == 4
    assert [(e, s) for e, s, _ in published(s3_root)] == [(E1, 2), (E1, 4)]
    assert all(p.startswith(exec_dir + "/") for _e, _s, p in published(s3_root))


def test_hf_carries_on_when_its_publication_is_already_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import dispatch_env, make_trainer, published

    root = tmp_path / "root"
    exec_dir = dispatch_env(root, "a" * 26, E1, "", monkeypatch)
    # The same (epoch, step, path) published earlier, e.g. by hand before a retry.
    (Path(exec_dir) / "checkpoint-2").mkdir(parents=True)
    store.publish(str(root), E1, 2, f"{exec_dir}/checkpoint-2")
    callback = DispatchCallback()
    trainer = make_trainer(tmp_path / "out", 4, [callback])
    trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    assert trainer.state.global_step == 4
    assert [s for _e, s, _p in published(root)] == [2, 4]
    assert len(callback.publications) == 2

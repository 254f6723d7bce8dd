"""A publication whose answer was lost (docs/invariants.md, 2), against each real remote
server (SeaweedFS for s3://, Azurite for az://) behind a proxy that lets the server apply the
conditional create and then drops its answer: the SDK retries, meets the conflict (S3's 412,
Azure's 409 BlobAlreadyExists), and the publication is still this call's own.  And the same name
published earlier by another call: the store says so (AlreadyPublished), ``dispatch publish``
says "already published" and exits 0 on every store, and the integrations carry on.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from slurm_dispatch.checkpoint import model
from slurm_dispatch.checkpoint import publish as store
from slurm_dispatch.errors import AlreadyPublished

from .faulty_proxy import FaultyProxy

E1 = model.Epoch(0, 1, 0).value
REPO = str(Path(__file__).resolve().parents[2])
CLI = [sys.executable, "-c", "from slurm_dispatch.cli.dispatch import main; main()"]

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@dataclass
class Served:
    """A fresh root on a real server, and how to send the store's SDK to another endpoint."""

    root: str
    upstream: str  # the server's own endpoint
    conflict: int  # what the SDK's retry of an applied conditional create meets
    point_at: Callable[[str], None]  # the SDK's endpoint from now on (this process and children)


def served_s3(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Served:
    server = request.getfixturevalue("s3_env")
    return Served(
        request.getfixturevalue("s3_root"),
        server.endpoint,
        412,
        lambda endpoint: monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint),
    )


def served_az(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Served:
    from slurm_dispatch.checkpoint.stores.azure import CONNECTION_ENV

    server = request.getfixturevalue("azurite")
    upstream = f"http://127.0.0.1:{server.port}"

    def point_at(endpoint: str) -> None:
        conn = server.connection_string.replace(upstream + "/", endpoint + "/")
        monkeypatch.setenv(CONNECTION_ENV, conn)

    return Served(request.getfixturevalue("az_raw").root, upstream, 409, point_at)


@pytest.fixture(params=["s3", "az"])
def served(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Served:
    """A fresh root of each remote store, on its real server."""
    return {"s3": served_s3, "az": served_az}[request.param](request, monkeypatch)


def pub_puts(proxy: FaultyProxy) -> list[int]:
    """The status answered to each PUT of a publication (0: the answer was dropped)."""
    return [status for method, path, status in proxy.seen if method == "PUT" and "/pub/" in path]


@contextlib.contextmanager
def first_publication_answer_dropped(served: Served) -> Iterator[FaultyProxy]:
    """The store's SDK talks to the server through a proxy that drops the answer to the first
    PUT of a publication once the server has applied it."""
    with FaultyProxy(served.upstream) as proxy:
        served.point_at(proxy.endpoint)
        proxy.drop_answer_next("PUT", "/pub/")
        yield proxy


def test_a_publication_whose_answer_was_lost_is_returned_as_made(served: Served) -> None:
    root = served.root
    save = root + "/exec/a/c5"
    with first_publication_answer_dropped(served) as proxy:
        name = store.publish(root, E1, 5, save)
        # The server made it, its answer never came; the SDK's retry met the conflict.
        assert pub_puts(proxy) == [0, served.conflict]
        assert name == model.format_name(E1, 5, "exec/a/c5")
        assert [(f.epoch, f.step, f.path) for f in store.list_publications(root)] == [(E1, 5, save)]
        # Another call publishing the same name finds it there before it: that is said.
        with pytest.raises(AlreadyPublished, match=name + r".*before this call"):
            store.publish(root, E1, 5, save)
        assert pub_puts(proxy) == [0, served.conflict, served.conflict]


def test_a_lost_answer_is_settled_well_within_a_short_deadline(served: Served) -> None:
    # The SDK's retry comes soon enough for a 5 s deadline (Azure's default first backoff, 12
    # to 18 s, ran past it: StoreTimeout for a publication the server had made).
    save = served.root + "/exec/a/c6"
    with first_publication_answer_dropped(served) as proxy:
        name = store.publish(served.root, E1, 6, save, timeout=5)
        assert pub_puts(proxy) == [0, served.conflict]
    assert name == model.format_name(E1, 6, "exec/a/c6")


def test_a_lost_answer_whose_owner_cannot_be_read_is_not_called_anothers(
    served: Served,
) -> None:
    save = served.root + "/exec/a/c8"
    with first_publication_answer_dropped(served) as proxy:
        proxy.fail_next("HEAD", 500, "InternalError", times=10)  # past every SDK retry
        with pytest.raises(AlreadyPublished, match=r"or by it with the answer lost"):
            store.publish(served.root, E1, 8, save)
        assert pub_puts(proxy) == [0, served.conflict]


@pytest.mark.parametrize("timeout", [3, 60])
def test_a_publication_whose_answers_never_come_says_it_may_be_made(
    served: Served, timeout: int
) -> None:
    # 3 s: the deadline comes first (StoreTimeout); 60 s: the SDK's retries run out first
    # (S3's 3 attempts, Azure's 4), and that too must not read as "not published".  Which
    # came first at 3 s was chance on S3 (botocore's backoff is random).
    from slurm_dispatch.errors import StoreError

    save = served.root + "/exec/a/c4"
    with first_publication_answer_dropped(served) as proxy:
        proxy.drop_answer_next("PUT", "/pub/", times=10)
        with pytest.raises(StoreError, match="whether it was published is unknown"):
            store.publish(served.root, E1, 4, save, timeout=timeout)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60, cwd=REPO)


def test_dispatch_publish_with_a_lost_answer_prints_the_name_and_exits_0(served: Served) -> None:
    save = served.root + "/exec/a/c7"
    with first_publication_answer_dropped(served) as proxy:
        done = run_cli("publish", "--root", served.root, "--epoch", str(E1), "--step", "7", save)
        assert pub_puts(proxy) == [0, served.conflict]
    assert (done.returncode, done.stdout) == (0, model.format_name(E1, 7, "exec/a/c7") + "\n")
    assert done.stderr == ""


@pytest.mark.parametrize("kind", ["posix", "s3", "az"])
def test_dispatch_publish_of_a_name_already_there_says_so_and_exits_0(
    kind: str, request: pytest.FixtureRequest
) -> None:
    root = request.getfixturevalue(f"{kind}_raw").root
    save = root + "/exec/a/c9"
    if kind == "posix":
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
def first_answer_lost(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """An execution on a fresh s3:// root (yielded) whose first publication's answer is
    dropped; on leaving, the answers were: dropped, 412 to botocore's retry, then 200 for the
    next save."""
    from .test_integrations_s3 import dispatch_env

    served = served_s3(request, monkeypatch)
    dispatch_env(served.root, tmp_path, "a" * 26, E1, "", monkeypatch)
    with first_publication_answer_dropped(served) as proxy:
        yield served.root
        assert pub_puts(proxy) == [0, 412, 200]


def test_hf_on_s3_carries_on_when_a_publications_answer_is_lost(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurm_dispatch.integrations.transformers import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_transformers import make_trainer

    from .test_integrations_s3 import published

    with first_answer_lost(request, tmp_path, monkeypatch) as s3_root:
        exec_dir = f"{s3_root}/exec/{'a' * 26}"
        callback = DispatchCallback()
        trainer = make_trainer(tmp_path / "out", 4, [callback])
        trainer.train(resume_from_checkpoint=resume_from_checkpoint())
    assert trainer.state.global_step == 4
    assert published(s3_root) == [(E1, s, f"{exec_dir}/checkpoint-{s}") for s in (2, 4)]
    assert callback.publications == [
        model.format_name(E1, s, f"exec/{'a' * 26}/checkpoint-{s}") for s in (2, 4)
    ]


def test_lightning_on_s3_carries_on_when_a_publications_answer_is_lost(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from slurm_dispatch.integrations.lightning import DispatchCallback, resume_from_checkpoint
    from tests.unit.test_integrations_lightning import fit

    from .test_integrations_s3 import published

    with first_answer_lost(request, tmp_path, monkeypatch) as s3_root:
        exec_dir = f"{s3_root}/exec/{'a' * 26}"
        trainer, _model = fit(
            tmp_path,
            4,
            [ModelCheckpoint(every_n_train_steps=2, save_top_k=-1), DispatchCallback()],
            ckpt_path=resume_from_checkpoint(),
        )
    assert trainer.global_step == 4
    assert [(e, s) for e, s, _ in published(s3_root)] == [(E1, 2), (E1, 4)]
    assert all(p.startswith(exec_dir + "/") for _e, _s, p in published(s3_root))


def test_hf_carries_on_when_its_publication_is_already_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_an_execution_file_whose_answer_was_lost_is_made_not_called_existing(
    served: Served,
) -> None:
    """The launcher's record of an execution (create-once in its own exec/<attempt>/) whose
    answer was lost: the SDK's retry met the conflict, and the store said FileExistsError for
    its own create, which ended the launch; now it is this call's own (its token, as a
    publication's).  Another call's create of the same file is still refused."""
    from slurm_dispatch.checkpoint.stores.open import open_store

    attempt, name = "b" * 26, ".dispatch-exec.json"
    with FaultyProxy(served.upstream) as proxy:
        served.point_at(proxy.endpoint)
        proxy.drop_answer_next("PUT", f"/exec/{attempt}/")
        st = open_store(served.root, timeout=30)
        st.create_exec_file(attempt, name, b'{"a": 1}')  # type: ignore[attr-defined]
        puts = [s for m, p, s in proxy.seen if m == "PUT" and f"/exec/{attempt}/" in p]
        assert puts == [0, served.conflict]
        assert st.read_exec_file(attempt, name) == b'{"a": 1}'  # type: ignore[attr-defined]
        with pytest.raises(FileExistsError, match=re.escape(name)):
            st.create_exec_file(attempt, name, b'{"a": 1}')  # type: ignore[attr-defined]


def test_a_record_whose_answer_was_lost_is_made_not_called_existing(served: Served) -> None:
    """put_json_once (the in-job half's create-once records: the resume record, a save's
    manifest) whose answer was lost answered False, 'it exists', for its own create; now
    True, as a publication's own is.  Another call's create of it is still False."""
    from slurm_dispatch.checkpoint.stores import remote

    url = f"{served.root}/exec/{'c' * 26}/.dispatch-resume.json"
    with FaultyProxy(served.upstream) as proxy:
        served.point_at(proxy.endpoint)
        proxy.drop_answer_next("PUT", "/.dispatch-resume.json")
        assert remote.put_json_once(url, {"resume_from": ""}, 30) is True
        puts = [s for m, p, s in proxy.seen if m == "PUT" and p.endswith(".dispatch-resume.json")]
        assert puts == [0, served.conflict]
        assert remote.read_json(url, 30) == {"resume_from": ""}
        assert remote.put_json_once(url, {"resume_from": ""}, 30) is False


def test_a_mark_whose_answer_was_lost_is_made_not_called_already_there(served: Served) -> None:
    """A pin or quarantine mark (create-once) whose answer was lost answered False, 'already
    marked', for its own create; now True.  Marking it again is still False."""
    from slurm_dispatch.checkpoint.stores.open import open_store

    with FaultyProxy(served.upstream) as proxy:
        served.point_at(proxy.endpoint)
        proxy.drop_answer_next("PUT", "/quarantine/")
        st = open_store(served.root, timeout=30)
        assert st.create_mark("quarantine", "MV4GKYZPMEXWG") is True  # type: ignore[attr-defined]
        puts = [s for m, p, s in proxy.seen if m == "PUT" and "/quarantine/" in p]
        assert puts == [0, served.conflict]
        assert st.create_mark("quarantine", "MV4GKYZPMEXWG") is False  # type: ignore[attr-defined]
        assert st.list_marks("quarantine") == ["MV4GKYZPMEXWG"]  # type: ignore[attr-defined]

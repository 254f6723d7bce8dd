"""dispatch-admin doctor against a site on this machine: the shipped parts installed the way the
admin guide says (knobs set), run for real, then broken in each way a site breaks them: a wrong
Python (the shipped default, and one without the package), a missing part, an unwritable
StateDir, mixed versions.  Nothing is faked: the parts, their Pythons and StateDir are real."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = {
    "prolog.d/05-dispatch": "contrib/prolog.d/05-dispatch",
    "epilog.d/05-dispatch": "contrib/epilog.d/05-dispatch",
    "dispatch-recheck": "site-config/dispatch-recheck",
}


def install(etc: Path, python: str, conf: Path | str, only: tuple[str, ...] = tuple(PARTS)) -> None:
    for target, source in PARTS.items():
        if target not in only:
            continue
        text = (REPO / source).read_text()
        lines = [
            f"DISPATCH_PYTHON={python}"
            if line.startswith("DISPATCH_PYTHON=")
            else f"DISPATCH_CONF={conf}"
            if line.startswith("DISPATCH_CONF=")
            else line
            for line in text.splitlines()
        ]
        path = etc / target
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o755)


@pytest.fixture()
def site(tmp_path: Path) -> Path:
    """A site as the admin guide installs it: parts, slurm.conf lines, dispatch.conf, StateDir."""
    etc = tmp_path / "etc"
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    etc.mkdir()
    (etc / "dispatch.conf").write_text(f"StateDir={state}\n")
    install(etc, sys.executable, etc / "dispatch.conf")
    (etc / "slurm.conf").write_text("ClusterName=doctor\nInclude site.conf\n")
    (etc / "site.conf").write_text(
        f"Prolog={etc}/prolog.d/*\nEpilog={etc}/epilog.d/*\n"
        f"PrologSlurmctld={etc}/prolog.d/05-dispatch\n"
        f"EpilogSlurmctld={etc}/epilog.d/05-dispatch\n"
        f"HealthCheckProgram={etc}/dispatch-recheck\nHealthCheckInterval=60\n"
        "PrologEpilogTimeout=60\n"
    )
    return tmp_path


@contextmanager
def counting_in(folder: Path, seen: Path = Path("/run/slurm-dispatch")) -> Iterator[list[str]]:
    """A command prefix that runs a command with ``seen``, where hook parts that find no
    dispatch.conf count their runs (metrics.unconfigured_dir()), replaced by ``folder`` in a
    mount namespace of its own: the counts go to the test's folder, never to the machine's
    /run, which every doctor run on this machine reads (a count left there for a day made the
    doctor of other tests' sites warn, and those tests fail).  ``seen`` is made for the mount
    while it runs if it is missing, and removed again if still empty."""
    made = not seen.exists()
    seen.mkdir(mode=0o755, exist_ok=True)
    script = f'mount --bind {shlex.quote(str(folder))} {shlex.quote(str(seen))} && exec "$@"'
    try:
        yield [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "counting-in",
        ]
    finally:
        if made:
            with suppress(OSError):
                seen.rmdir()


def doctor(site: Path, *args: str, prefix: tuple[str, ...] = ()) -> tuple[int, dict]:
    """The doctor as an admin runs it (its --json), after ``prefix`` when given."""
    proc = subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "slurm_dispatch.cli.admin",
            "doctor",
            "--slurm-conf",
            str(site / "etc/slurm.conf"),
            "--node",
            "n1",
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stderr == ""
    return proc.returncode, json.loads(proc.stdout)


def diagnose(site: Path, controller: bool = False) -> tuple[int, dict]:
    """The doctor's checks without the command's start-up (the parts are still run)."""
    from slurm_dispatch.node import doctor as doctor_module

    checks = doctor_module.Doctor(
        slurm_conf=str(site / "etc/slurm.conf"), node="n1", controller=controller
    ).run()
    bad = doctor_module.failed(checks)
    return (1 if bad else 0), {"ok": not bad, "checks": list(doctor_module.iter_json(checks))}


def states(report: dict) -> dict[str, str]:
    return {c["check"]: c["state"] for c in report["checks"]}


def check(report: dict, name: str) -> dict:
    return next(c for c in report["checks"] if c["check"] == name)


def leftovers(site: Path) -> list[str]:
    return sorted(
        str(p.relative_to(site / "state")) for p in (site / "state").rglob("*") if p.is_file()
    )


def test_a_working_site_passes_and_the_doctor_leaves_nothing(site: Path) -> None:
    # Runs counted on this host before (other tests' parts without dispatch.conf, on a shared
    # machine): the doctor rightly warns of them; this site's parts add none.
    counted = Path("/run/slurm-dispatch/slurm-dispatch-unconfigured.prom")
    before = counted.read_text() if counted.exists() else None
    code, report = doctor(site, "--controller")
    assert code == 0, report
    assert report["ok"] is True and report["node"] == "n1"
    seen = states(report)
    if before is not None:
        assert (counted.read_text() if counted.exists() else None) == before
        seen.pop("unconfigured runs", None)
    assert set(seen.values()) == {"ok"}, report
    for hook, kind in [
        ("Prolog", "start.n1."),
        ("Epilog", "end.n1."),
        ("PrologSlurmctld", "ctld-start.slurmctld."),
        ("EpilogSlurmctld", "ctld-end.slurmctld."),
    ]:
        assert kind in check(report, f"{hook} runs")["detail"]
    assert leftovers(site) == []  # its own job's facts are gone, its probe too


def test_the_text_fits_a_table_and_ends_with_a_verdict(site: Path) -> None:
    os.unlink(site / "etc/epilog.d/05-dispatch")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_dispatch.cli.admin",
            "doctor",
            "--slurm-conf",
            str(site / "etc/slurm.conf"),
            "--node",
            "n1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["STATE", "CHECK", "DETAIL"]
    assert any(line.split()[:2] == ["FAIL", "Epilog"] for line in lines)
    assert any(
        line.startswith("fix Epilog: install contrib/epilog.d/05-dispatch as ") for line in lines
    )
    assert lines[-1] == "n1: 1 problem found"


def test_the_shipped_default_python_is_named_with_the_fix(site: Path) -> None:
    # The shipped part's default: the admin guide's venv, absent on this node.
    install(
        site / "etc",
        "/opt/slurm-dispatch/bin/python",
        site / "etc/dispatch.conf",
        only=("epilog.d/05-dispatch",),
    )
    code, report = doctor(site)
    assert code == 1 and report["ok"] is False
    python = check(report, "Epilog python")
    assert python["state"] == "FAIL"
    assert "DISPATCH_PYTHON=/opt/slurm-dispatch/bin/python is not an executable" in python["detail"]
    assert f"(this doctor's: {sys.executable})" in python["fix"]
    assert states(report)["Prolog runs"] == "ok"  # the other parts are still run and pass


def test_a_python_without_the_package_is_named(site: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120
    )
    install(
        site / "etc",
        str(bare / "bin/python"),
        site / "etc/dispatch.conf",
        only=("epilog.d/05-dispatch",),
    )
    code, report = diagnose(site)
    assert code == 1
    python = check(report, "Epilog python")
    assert python["state"] == "FAIL"
    assert f"DISPATCH_PYTHON={bare}/bin/python cannot import slurm_dispatch" in python["detail"]
    assert "No module named 'slurm_dispatch'" in python["detail"]
    assert "Epilog runs" not in states(report)


@pytest.mark.parametrize(
    "how",
    [
        "deleted",
        "not-executable",
        "glob-matches-nothing",
        "controller-part-deleted",
        "no-epilog-line",
    ],
)
def test_a_missing_part_is_named(site: Path, how: str) -> None:
    epilog = site / "etc/epilog.d/05-dispatch"
    if how == "deleted":
        epilog.unlink()
    elif how == "not-executable":
        epilog.chmod(0o644)
    elif how == "glob-matches-nothing":
        shutil.rmtree(site / "etc/epilog.d")
    elif how == "controller-part-deleted":
        conf = site / "etc/site.conf"
        conf.write_text(
            conf.read_text().replace(
                f"EpilogSlurmctld={site}/etc/epilog.d/05-dispatch",
                f"EpilogSlurmctld={site}/etc/gone/05-dispatch",
            )
        )
    else:
        conf = site / "etc/site.conf"
        conf.write_text(
            "".join(
                line for line in conf.read_text().splitlines(True) if not line.startswith("Epilog=")
            )
        )
    code, report = diagnose(site, controller=how == "controller-part-deleted")
    assert code == 1
    name = "EpilogSlurmctld" if how == "controller-part-deleted" else "Epilog"
    failed = check(report, name)
    assert failed["state"] == "FAIL", report
    words = {
        "deleted": "runs no slurm-dispatch part",
        "not-executable": "not executable: slurmd cannot run it",
        "glob-matches-nothing": "(the glob matches nothing)",
        "controller-part-deleted": f"{site}/etc/gone/05-dispatch is missing",
        "no-epilog-line": "sets no Epilog",
    }[how]
    assert words in failed["detail"]
    assert failed["fix"]
    assert [c["check"] for c in report["checks"] if c["state"] == "FAIL"] == [name]
    assert leftovers(site) == []


@pytest.mark.parametrize("how", ["absent", "others-may-write", "owned-by-another"])
def test_an_unwritable_state_dir_is_named(site: Path, how: str) -> None:
    state = site / "state"
    if how == "absent":
        state.rmdir()
    elif how == "others-may-write":
        state.chmod(0o1777)
    else:
        os.chown(state, 65534, -1) if os.geteuid() == 0 else pytest.skip("needs root")
    code, report = diagnose(site)
    assert code == 1
    found = check(report, "StateDir")
    assert found["state"] == "FAIL"
    assert {
        "absent": "No such file or directory",
        "others-may-write": "writable by group or others",
        "owned-by-another": "is owned by uid 65534",
    }[how] in found["detail"]
    assert "chmod 0755" in found["fix"]
    # Each part is run the way slurmd runs it and is seen to record nothing, with the hook's
    # own words (which slurmd discards).
    runs = check(report, "Prolog runs")
    assert runs["state"] == "FAIL"
    assert "exit 0" in runs["detail"] and "but no start fact" in runs["detail"]
    assert "cannot open StateDir" in runs["detail"] or "refusing" in runs["detail"]


def test_mixed_versions_are_named(site: Path, tmp_path: Path) -> None:
    # Another release on the controller: a real venv whose slurm_dispatch says 0.0.9.
    old = tmp_path / "old"
    shutil.copytree(
        REPO / "slurm_dispatch",
        old / "src/slurm_dispatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    init = old / "src/slurm_dispatch/__init__.py"
    init.write_text(init.read_text().replace('__version__ = "0.1.0"', '__version__ = "0.0.9"'))
    venv = old / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    (next((venv / "lib").glob("python3*")) / "site-packages/old.pth").write_text(f"{old / 'src'}\n")
    etc = site / "etc"
    controller = site / "ctl"
    install(
        controller,
        str(venv / "bin/python"),
        etc / "dispatch.conf",
        only=("prolog.d/05-dispatch", "epilog.d/05-dispatch"),
    )
    conf = etc / "site.conf"
    conf.write_text(conf.read_text().replace(f"Slurmctld={etc}/", f"Slurmctld={controller}/"))
    code, report = diagnose(site, controller=True)
    assert code == 1
    assert check(report, "PrologSlurmctld python")["detail"].endswith("slurm-dispatch 0.0.9")
    assert states(report)["PrologSlurmctld runs"] == "ok"  # it works, but not with the rest
    versions = check(report, "versions")
    assert versions["state"] == "FAIL"
    assert f"{controller}/prolog.d/05-dispatch 0.0.9" in versions["detail"]
    assert f"{etc}/prolog.d/05-dispatch 0.1.0" in versions["detail"]
    assert "install one release everywhere" in versions["fix"]
    assert leftovers(site) == []


def test_facts_written_by_another_release_on_the_controller_are_named(site: Path) -> None:
    # The nodes' hooks and the controller's on different machines: their facts say which
    # release wrote them, and the doctor compares the latest of each.
    from slurm_dispatch.node import factstore

    state = str(site / "state")
    factstore.write_fact(state, 1000, 1000, "100", "start", "n7", {"time": 1.0, "restart": 0})
    factstore.write_fact(
        state,
        1000,
        1000,
        "100",
        "ctld-start",
        "slurmctld",
        {"time": 1.0, "restart": 0, "release": "0.0.9"},
    )
    code, report = diagnose(site)
    assert code == 1
    found = check(report, "releases recorded")
    assert found["state"] == "FAIL"
    assert "n7 0.1.0 (job 100), slurmctld 0.0.9 (job 100)" in found["detail"]
    assert "install one release" in found["fix"]
    factstore.write_fact(
        state, 1000, 1000, "101", "ctld-start", "slurmctld", {"time": 2.0, "restart": 0}
    )
    code, report = diagnose(site)
    assert code == 0 and check(report, "releases recorded")["state"] == "ok"


# -- a controller whose SlurmUser is not root (the doctor assumed root) ---------------------


@pytest.fixture()
def slurm_user() -> Iterator[pwd.struct_passwd]:
    """A system account made for the test, named as SlurmUser (removed afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: makes an account and runs the controller parts as it")
    name = f"ddoc{os.getpid()}"
    subprocess.run(
        [
            "useradd",
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ],
        check=True,
        timeout=60,
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, timeout=60)


@pytest.fixture()
def controller(slurm_user: pwd.struct_passwd) -> Iterator[Path]:
    """A controller host as the admin guide sets one up for SlurmUser=<not root>: the parts
    with DISPATCH_CONF naming a dispatch.conf whose StateDir is SlurmUser's own, a Python that
    account may run (a venv of the system's Python with this checkout on its path), all in a
    folder every account may pass through (pytest's own is root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="doctor-ctld-", dir="/var/tmp"))
    base.chmod(0o755)
    venv = base / "venv"
    subprocess.run(
        ["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    (next((venv / "lib").glob("python3*")) / "site-packages/checkout.pth").write_text(f"{REPO}\n")
    state = base / "ctld-state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    os.chown(state, slurm_user.pw_uid, slurm_user.pw_gid)
    etc = base / "etc"
    etc.mkdir(mode=0o755)
    (etc / "dispatch.conf").write_text(f"StateDir={state}\n")
    install(
        etc,
        str(venv / "bin/python"),
        etc / "dispatch.conf",
        only=("prolog.d/05-dispatch", "epilog.d/05-dispatch"),
    )
    (etc / "slurm.conf").write_text(
        f"ClusterName=doctor\nSlurmUser={slurm_user.pw_name}\n"
        f"PrologSlurmctld={etc}/prolog.d/05-dispatch\n"
        f"EpilogSlurmctld={etc}/epilog.d/05-dispatch\n"
    )
    try:
        yield base
    finally:
        shutil.rmtree(base)


def diagnose_controller(base: Path) -> tuple[int, dict]:
    from slurm_dispatch.node import doctor as doctor_module

    checks = doctor_module.Doctor(
        slurm_conf=str(base / "etc/slurm.conf"), node="c1", controller=True, node_parts=False
    ).run()
    bad = doctor_module.failed(checks)
    return (1 if bad else 0), {"ok": not bad, "checks": list(doctor_module.iter_json(checks))}


def test_the_controller_parts_run_as_slurm_user_into_its_state_dir(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    name = slurm_user.pw_name
    code, report = diagnose_controller(controller)
    assert code == 0, report
    assert check(report, "SlurmUser")["detail"].startswith(f"{name} (uid {slurm_user.pw_uid})")
    state = check(report, f"StateDir (SlurmUser {name})")
    assert (
        state["state"] == "ok" and f"owned by uid {slurm_user.pw_uid} ({name})" in state["detail"]
    )
    for hook, kind in [("PrologSlurmctld", "ctld-start"), ("EpilogSlurmctld", "ctld-end")]:
        ran = check(report, f"{hook} runs")
        assert ran["state"] == "ok" and f"as SlurmUser {name}, recorded " in ran["detail"]
        assert f"/{kind}.slurmctld." in ran["detail"]
    assert "StateDir" not in states(report)  # root's own check is the nodes', not asked here
    left = [p for p in (controller / "ctld-state").rglob("*") if p.is_file()]
    assert left == []


def test_a_controller_state_dir_slurm_user_cannot_write_is_named(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    """The mistake the doctor hid while it ran everything as root: StateDir left root's, so
    slurmctld's hooks (SlurmUser) record nothing."""
    name = slurm_user.pw_name
    state = controller / "ctld-state"
    os.chown(state, 0, 0)
    code, report = diagnose_controller(controller)
    assert code == 1
    found = check(report, f"StateDir (SlurmUser {name})")
    assert found["state"] == "FAIL"
    assert (
        f"as SlurmUser {name} (uid {slurm_user.pw_uid}): StateDir '{state}' is owned by "
        f"uid 0, not {slurm_user.pw_uid}"
    ) in found["detail"]
    assert f"chown {name}: {state}" in found["fix"]
    runs = check(report, "PrologSlurmctld runs")
    assert runs["state"] == "FAIL" and "but no ctld-start fact" in runs["detail"]
    assert "refusing to use it" in runs["detail"]


def test_a_python_slurm_user_cannot_run_is_named(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    # A Python under a folder only root may enter (a venv under /root, as a site may have made
    # it): fine for root's node parts, not for slurmctld's.  Made here, so that the test does
    # not depend on where its own Python lives (CI's venv is one every account may run).
    hidden = controller / "root-only"
    hidden.mkdir(mode=0o700)
    python = hidden / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    with pytest.raises(PermissionError):
        subprocess.run([str(python), "-c", "0"], user=slurm_user.pw_uid, timeout=60)
    install(
        controller / "etc",
        str(python),
        controller / "etc/dispatch.conf",
        only=("prolog.d/05-dispatch",),
    )
    code, report = diagnose_controller(controller)
    assert code == 1
    found = check(report, "PrologSlurmctld python")
    assert found["state"] == "FAIL"
    assert (
        f"cannot be run as SlurmUser {slurm_user.pw_name}" in found["detail"]
        or f"cannot import slurm_dispatch as SlurmUser {slurm_user.pw_name}" in found["detail"]
    )
    assert states(report)["EpilogSlurmctld runs"] == "ok"


def test_a_metrics_dir_slurm_user_cannot_count_in_is_named(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    """Attack: MetricsDir (node_exporter's folder, root's) set in the controller's
    dispatch.conf: every PrologSlurmctld and EpilogSlurmctld, as SlurmUser, logged 'metrics
    not updated' to syslog and counted nothing, while the doctor said every check passed."""
    name = slurm_user.pw_name
    metrics_dir = controller / "textfile"
    metrics_dir.mkdir(mode=0o755)
    conf = controller / "etc/dispatch.conf"
    conf.write_text(conf.read_text() + f"MetricsDir={metrics_dir}\n")
    code, report = diagnose_controller(controller)
    assert code == 1, report
    found = check(report, f"MetricsDir (SlurmUser {name})")
    assert found["state"] == "FAIL"
    assert (
        f"as SlurmUser {name} (uid {slurm_user.pw_uid}): MetricsDir '{metrics_dir}' is "
        f"owned by uid 0 with mode 0755; it must be owned by uid {slurm_user.pw_uid}"
    ) in found["detail"], found
    assert f"chown {name}: DIR" in found["fix"]
    assert states(report)["PrologSlurmctld runs"] == "ok"  # facts recorded all the same
    os.chown(metrics_dir, slurm_user.pw_uid, slurm_user.pw_gid)
    code, report = diagnose_controller(controller)
    assert code == 0, report
    assert (
        check(report, f"MetricsDir (SlurmUser {name})")["detail"]
        == f"{metrics_dir}: the hooks as SlurmUser {name} count there"
    )
    assert (metrics_dir / "slurm-dispatch.prom").is_file()  # and they did


def test_a_metrics_dir_others_may_write_is_named(site: Path) -> None:
    metrics_dir = site / "textfile"
    metrics_dir.mkdir()
    metrics_dir.chmod(0o777)
    conf = site / "etc/dispatch.conf"
    conf.write_text(conf.read_text() + f"MetricsDir={metrics_dir}\n")
    code, report = diagnose(site)
    assert code == 1, report
    found = check(report, "MetricsDir")
    assert found["state"] == "FAIL" and "with mode 0777" in found["detail"], found
    assert found["fix"].startswith(f"as root: mkdir -p {metrics_dir} && chown root: ")
    assert not (metrics_dir / "slurm-dispatch.prom").exists()  # the hooks counted nothing
    metrics_dir.chmod(0o755)
    code, report = diagnose(site)
    assert code == 0 and check(report, "MetricsDir")["state"] == "ok", report


def test_the_clean_up_of_slurm_users_state_dir_follows_no_link_it_planted(
    controller: Path, slurm_user: pwd.struct_passwd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the doctor removed its job's folder under SlurmUser's StateDir as root,
    by path, so SlurmUser (whose PrologSlurmctld ran for that job, and saw its id) could turn
    StateDir/facts into a symlink and have root remove a folder of that name elsewhere, one
    SlurmUser may not touch.  The doctor's token is fixed here to name that folder."""
    from slurm_dispatch.node import factstore

    monkeypatch.setattr(factstore, "new_token", lambda: "0" * 24)
    job_id = f"doctor-{'0' * 24}"
    elsewhere = controller / "roots"
    (elsewhere / "0" / job_id).mkdir(parents=True)
    precious = elsewhere / "0" / job_id / "precious"
    precious.write_text("root's\n")
    part = controller / "etc/prolog.d/05-dispatch"
    real = controller / "etc/prolog.d/real-part"
    part.rename(real)
    state = controller / "ctld-state"
    python = next(
        line for line in real.read_text().splitlines() if line.startswith("DISPATCH_PYTHON=")
    )
    part.write_text(
        f"#!/bin/sh\n# runs slurm_dispatch.hooks' part, then plants a link\n"
        f"{python}\n{real}\nrm -rf {state}/facts && ln -s {elsewhere} "
        f"{state}/facts\nexit 0\n"
    )
    part.chmod(0o755)
    diagnose_controller(controller)  # its run then finds no fact through the link: FAIL
    assert (state / "facts").is_symlink()  # the link was planted, as SlurmUser
    assert precious.read_text() == "root's\n"


def test_a_probe_as_slurm_user_that_hangs_or_dies_is_not_taken_for_ok(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The doctor's checks as SlurmUser (StateDir, MetricsDir) read the forked probe's words,
    and no words means ok; a probe killed (the OOM killer, a crash in a C library) or hung on a
    StateDir whose NFS server is gone said nothing, so the check read ok (or, hung, the doctor
    never finished).  Now the probe has PROBE_TIMEOUT, and a child that did not end by itself
    says so."""
    import signal
    import time

    from slurm_dispatch.node import doctor

    monkeypatch.setattr(doctor, "PROBE_TIMEOUT", 1, raising=False)
    nobody = pwd.getpwnam("nobody")

    def hangs() -> str:
        time.sleep(5)
        return ""

    def dies() -> str:
        os.kill(os.getpid(), signal.SIGKILL)
        return ""

    assert "gave no answer within 1 s" in doctor.as_account(nobody, hangs)
    assert "was killed by signal 9" in doctor.as_account(nobody, dies)
    assert doctor.as_account(nobody, lambda: "") == ""
    assert doctor.as_account(nobody, lambda: "a reason") == "a reason"


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_part_installed_twice_is_named(site: Path, hook: str) -> None:
    # A newcomer keeps the shipped part's copy beside the one edited (DISPATCH_PYTHON), and the
    # glob runs both: each execution records two starts (one never ended: prune keeps its
    # folder for ever) or a second end tied to no start.
    part = site / f"etc/{hook}.d/05-dispatch"
    shutil.copy2(part, site / f"etc/{hook}.d/05-dispatch.orig")
    code, report = diagnose(site)
    named = [c for c in report["checks"] if c["check"] == hook.capitalize() and c["state"] != "ok"]
    assert named and "05-dispatch.orig" in named[0]["detail"], report["checks"]
    assert "twice" in named[0]["detail"] and "05-dispatch.orig" in named[0]["fix"]


def test_parts_that_find_no_dispatch_conf_where_slurm_gives_them_no_slurm_conf_are_named(
    site: Path,
) -> None:
    """slurm.conf outside /etc/slurm, dispatch.conf beside it and the parts'
    DISPATCH_CONF left empty (the admin guide allowed it).  slurmd gives the Prolog and Epilog
    SLURM_CONF, so they find dispatch.conf; slurmctld gives PrologSlurmctld and EpilogSlurmctld
    no SLURM_CONF and slurmd gives HealthCheckProgram only SLURMD_NODENAME (Slurm's
    prep_script_slurmctld.c and slurmd.c build those environments from nothing), so those read
    /etc/slurm/dispatch.conf, find nothing and take the defaults.  The doctor gave every part
    SLURM_CONF and said every check passed."""
    etc = site / "etc"
    install(etc, sys.executable, "")  # DISPATCH_CONF= left empty
    assert "\nDISPATCH_CONF=\n" in (etc / "prolog.d/05-dispatch").read_text()
    assert not Path("/etc/slurm/dispatch.conf").exists()
    # Where this host has the default StateDir, the unconfigured parts record there (what they
    # make is removed again), else they count their runs in /run/slurm-dispatch: here a folder
    # of this test's own (counting_in).
    made = Path("/var/lib/slurm-dispatch/facts")
    existed = made.exists()
    seen = Path("/run/slurm-dispatch/slurm-dispatch-unconfigured.prom")
    before = seen.read_text() if seen.exists() else None
    counts = site / "run-slurm-dispatch"
    counts.mkdir(mode=0o755)
    counts.chmod(0o755)
    try:
        with counting_in(counts) as prefix:
            code, report = doctor(site, "--controller", prefix=tuple(prefix))
    finally:
        if not existed and made.is_dir():
            for folder in sorted(made.rglob("*"), reverse=True) + [made]:
                folder.rmdir()  # only empty folders: the doctor removed its job's facts
    assert (seen.read_text() if seen.exists() else None) == before  # nothing left there
    if not existed:
        assert (
            "slurm_dispatch_hook_runs_unconfigured_total"
            in (counts / "slurm-dispatch-unconfigured.prom").read_text()
        )
    assert code == 1, report
    bad = {c["check"] for c in report["checks"] if c["state"] == "FAIL"}
    assert {
        "PrologSlurmctld config",
        "EpilogSlurmctld config",
        "HealthCheckProgram config",
    } <= bad, report
    assert states(report)["Prolog runs"] == states(report)["Epilog runs"] == "ok"
    for key in ("PrologSlurmctld", "EpilogSlurmctld", "HealthCheckProgram"):
        found = check(report, f"{key} config")
        assert "/etc/slurm/dispatch.conf" in found["detail"], found
        assert "no SLURM_CONF" in found["detail"], found
        assert f"DISPATCH_CONF={etc / 'dispatch.conf'}" in found["fix"], found
    # (What the part then does depends on the host: where the default StateDir exists it
    # records there; test_hook_faults shows what it says where it does not.)
    # Installed as the fix says, every part finds it.
    install(etc, sys.executable, etc / "dispatch.conf")
    code, report = doctor(site, "--controller")
    assert code == 0, report


def test_the_checks_table_leaves_its_header_out_as_every_table_does() -> None:
    """`dispatch-admin doctor -H`, run on every node with pdsh, as `dispatch jobs -H`: one
    header line per node was all pdsh's merged output could not do without."""
    from slurm_dispatch.node import doctor

    checks = [
        doctor.Check("StateDir", doctor.OK, "writable"),
        doctor.Check("Epilog", doctor.FAIL, "not executable", "chmod +x it"),
    ]
    shown = doctor.render(checks, "n1", noheader=True).splitlines()
    assert [line.split()[0] for line in shown[:2]] == [doctor.OK, doctor.FAIL], shown
    assert shown[2:] == ["fix Epilog: chmod +x it", "n1: 1 problem found"], shown
    assert doctor.render(checks, "n1").splitlines()[0].split() == ["STATE", "CHECK", "DETAIL"]


def with_settings(site: Path, text: str) -> dict:
    """The doctor's report with ``text`` appended to slurm.conf's included part."""
    conf = site / "etc/site.conf"
    conf.write_text(conf.read_text() + text)
    return diagnose(site)[1]


def test_the_site_as_installed_reads_the_recheck_and_the_bounds_ok(site: Path) -> None:
    report = diagnose(site)[1]
    assert check(report, "HealthCheckInterval")["detail"] == (
        "HealthCheckInterval=60: the re-check runs on schedule"
    )
    assert (
        check(report, "PrologTimeout")["state"] == check(report, "EpilogTimeout")["state"] == "ok"
    )
    assert "CgroupJobIdPaths" not in states(report)  # proctrack/cgroup is not in use


@pytest.mark.parametrize(
    "state,when",
    [
        ("START_ONLY", "only when slurmd starts (25.11)"),
        ("REBOOT_ONLY", "only after the node reboots (26.05)"),
        ("IDLE,START_ONLY", "only when slurmd starts (25.11)"),
    ],
)
def test_a_health_check_that_runs_only_at_start_or_reboot_is_named(
    site: Path, state: str, when: str
) -> None:
    """HealthCheckNodeState=START_ONLY (25.11) and REBOOT_ONLY (26.05) stop
    the survivor re-check that lifts a shared-checkpoint hold; the doctor said nothing."""
    report = with_settings(site, f"HealthCheckNodeState={state}\n")
    found = check(report, "HealthCheckNodeState")
    assert found["state"] == "warn", report
    assert f"slurmd runs HealthCheckProgram {when}, not every 60 s" in found["detail"]
    assert (
        "shared-checkpoint hold" in found["detail"]
        and "re-checked only by the next Epilog" in found["detail"]
    )


def test_a_health_check_without_an_interval_never_runs_and_is_named(tmp_path: Path) -> None:
    """slurmd runs HealthCheckProgram only where HealthCheckInterval is set (0, the default,
    is never), so a site that added only HealthCheckProgram= had no re-check at all."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "dispatch.conf").write_text(f"StateDir={tmp_path}\n")
    install(etc, sys.executable, etc / "dispatch.conf", only=("dispatch-recheck",))
    (etc / "slurm.conf").write_text(f"HealthCheckProgram={etc}/dispatch-recheck\n")
    from slurm_dispatch.node import doctor as doctor_module

    checks = doctor_module.Doctor(slurm_conf=str(etc / "slurm.conf"), node="n1").run()
    found = next(c for c in checks if c.name == "HealthCheckInterval")
    assert found.state == "warn" and "slurmd never runs HealthCheckProgram" in found.detail
    assert found.fix.startswith("set HealthCheckInterval=60")


def test_prolog_and_epilog_timeouts_of_25_05_are_read_each_for_its_hook(site: Path) -> None:
    """25.05 split PrologEpilogTimeout into PrologTimeout and EpilogTimeout;
    one below HookTimeout lets Slurm stop the part first, which drains the node."""
    report = with_settings(site, "PrologTimeout=3\n")
    found = check(report, "PrologTimeout")
    assert found["state"] == "FAIL", report
    assert found["detail"] == (
        "PrologTimeout=3: Slurm stops the Prolog at 3 s, before the "
        "part's HookTimeout 5 s: a Prolog Slurm stops drains the node"
    )
    # the Epilog's bound is still PrologEpilogTimeout's
    assert check(report, "EpilogTimeout") == {
        "check": "EpilogTimeout",
        "state": "ok",
        "fix": "",
        "detail": "PrologEpilogTimeout=60: the Epilog part ends (HookTimeout 5 s) before "
        "Slurm would stop it",
    }


def test_where_the_epilog_reads_a_jobs_cgroup_is_said_under_proctrack_cgroup(site: Path) -> None:
    """26.05 names a job's cgroup by its SLUID unless
    CgroupJobIdPaths=yes; the Epilog reads both names, so the doctor says where it reads
    (it warned that the Epilog looked for job_<id> alone).  A CgroupRoot that is not
    cgroup.conf's CgroupMountpoint reads no job's cgroup at all: FAIL."""
    report = with_settings(site, "ProctrackType=proctrack/cgroup\n")
    found = check(report, "CgroupJobIdPaths")
    assert found["state"] == "ok", report
    assert "by its SLUID (26.05's cgroup/v2) or job_<id>" in found["detail"]
    assert "in slurmstepd's scope of any slice" in found["detail"]
    (site / "etc/cgroup.conf").write_text(
        "CgroupPlugin=cgroup/v2\nCgroupJobIdPaths=yes\nCgroupSlice=batch.slice\n"
    )
    found = check(diagnose(site)[1], "CgroupJobIdPaths")
    assert (
        found["state"] == "ok"
        and "by its job id (CgroupJobIdPaths=yes), in slurmstepd's scope of batch.slice"
        in found["detail"]
    )
    (site / "etc/cgroup.conf").write_text("CgroupMountpoint=/sys/fs/cgroup/unified\n")
    found = check(diagnose(site)[1], "CgroupRoot")
    assert found["state"] == "FAIL" and found["detail"].startswith(
        "CgroupRoot=/sys/fs/cgroup in dispatch.conf, but "
    )
    assert found["fix"] == "set CgroupRoot=/sys/fs/cgroup/unified in dispatch.conf"


def test_the_runs_the_hooks_counted_as_unconfigured_are_named(site: Path, tmp_path: Path) -> None:
    """A hook that finds no dispatch.conf counts the run where no
    configuration is needed; the doctor, where an admin looks, says how many of the last day
    there were (an older count is history, not a warning)."""
    import time

    from slurm_dispatch.node import doctor as doctor_module
    from slurm_dispatch.node import metrics

    folder = tmp_path / "unconfigured"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    tally = metrics.Tally()
    tally.add(metrics.UNCONFIGURED_RUNS, {"hook": "prolog-slurmctld"}, 2)
    tally.set(
        "slurm_dispatch_hook_last_run_timestamp_seconds",
        {"hook": "prolog-slurmctld"},
        time.time() - 60,
    )
    tally.add(metrics.UNCONFIGURED_RUNS, {"hook": "recheck"}, 7)
    tally.set(
        "slurm_dispatch_hook_last_run_timestamp_seconds",
        {"hook": "recheck"},
        time.time() - 3 * 86400,
    )
    metrics.update(str(folder), tally, file=metrics.UNCONFIGURED_FILE)
    doctor = doctor_module.Doctor(slurm_conf=str(site / "etc/slurm.conf"), node="n1")
    doctor.unconfigured_dir = str(folder)
    found = [c for c in doctor.run() if c.name == "unconfigured runs"]
    assert len(found) == 1 and found[0].state == "warn", found
    assert found[0].detail.startswith(
        f"{folder}/slurm-dispatch-unconfigured.prom: hook runs that found no dispatch.conf and "
        "recorded nothing: prolog-slurmctld 2 (the last "
    ), found[0].detail
    assert "recheck" not in found[0].detail
    assert metrics.unconfigured_dir(0) == "/run/slurm-dispatch"


def _count_as(account: pwd.struct_passwd, hook: str) -> None:
    """Count one unconfigured run as a hook running as ``account`` does (forked, as it)."""
    from slurm_dispatch import hooks

    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            hooks._count_unconfigured(hook, "7")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_the_unconfigured_runs_of_a_slurm_user_that_is_not_root_are_named(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    """Attack on a slurm.conf outside /etc/slurm: PrologSlurmctld and EpilogSlurmctld (the hooks
    Slurm gives no SLURM_CONF) run as SlurmUser, which count their unconfigured runs under
    /tmp/slurm-dispatch-<uid>; the doctor read root's /run/slurm-dispatch alone, and said
    nothing of them."""
    from slurm_dispatch.node import metrics

    folder = Path(metrics.unconfigured_dir(slurm_user.pw_uid))
    shutil.rmtree(folder, ignore_errors=True)
    try:
        _count_as(slurm_user, "prolog-slurmctld")
        assert (folder / metrics.UNCONFIGURED_FILE).is_file()
        _, report = diagnose_controller(controller)
        found = check(report, f"unconfigured runs (SlurmUser {slurm_user.pw_name})")
        assert found["state"] == "warn", report
        assert found["detail"].startswith(
            f"{folder}/{metrics.UNCONFIGURED_FILE}: hook runs that found no dispatch.conf and "
            "recorded nothing: prolog-slurmctld 1 (the last "
        ), found
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_slurm_users_count_folder_another_user_made_is_named(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    """/tmp is everyone's: a user who makes /tmp/slurm-dispatch-<SlurmUser's uid> first keeps
    every unconfigured controller hook from being counted (the hook logs it, no admin looks),
    and the doctor's warning of them away.  The doctor names the folder and its owner."""
    from slurm_dispatch.node import metrics

    folder = Path(metrics.unconfigured_dir(slurm_user.pw_uid))
    shutil.rmtree(folder, ignore_errors=True)
    nobody = pwd.getpwnam("nobody")
    folder.mkdir(mode=0o755)
    os.chown(folder, nobody.pw_uid, nobody.pw_gid)
    try:
        _count_as(slurm_user, "epilog-slurmctld")
        assert not (folder / metrics.UNCONFIGURED_FILE).exists()  # refused, as it must be
        _, report = diagnose_controller(controller)
        found = check(report, f"unconfigured runs (SlurmUser {slurm_user.pw_name})")
        assert found["state"] == "warn", report
        assert (
            f"{folder}" in found["detail"]
            and f"owned by uid {nobody.pw_uid}" in found["detail"]
            and "cannot count" in found["detail"]
        ), found
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_dispatch_conf_slurm_user_cannot_read_is_named(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    """DISPATCH_CONF naming a file root reads and SlurmUser cannot (a 0600 copy): the
    controller's hooks take the defaults; the doctor, reading it as root, must not pass."""
    (controller / "etc/dispatch.conf").chmod(0o600)
    code, report = diagnose_controller(controller)
    assert code == 1, report
    bad = [c for c in report["checks"] if c["state"] == "FAIL"]
    assert any("Permission denied" in c["detail"] for c in bad), bad


def test_quoted_knobs_are_read_as_the_shell_reads_them(
    controller: Path, slurm_user: pwd.struct_passwd
) -> None:
    """An admin who quotes the knobs (DISPATCH_CONF="/etc/..."), as sh allows: the parts run
    as before, and the doctor said 'DISPATCH_CONF is empty' (it took the quotes for part of
    the path, found no such file) and could not run the Python."""
    for part in (controller / "etc/prolog.d/05-dispatch", controller / "etc/epilog.d/05-dispatch"):
        text = part.read_text()
        text = re.sub(r"^DISPATCH_CONF=(\S+)", r'DISPATCH_CONF="\1"   # quoted', text, flags=re.M)
        text = re.sub(r"^DISPATCH_PYTHON=(\S+)", r"DISPATCH_PYTHON='\1'", text, flags=re.M)
        part.write_text(text)
    code, report = diagnose_controller(controller)
    assert code == 0, [c for c in report["checks"] if c["state"] != "ok"]
    assert check(report, "PrologSlurmctld runs")["state"] == "ok"


def test_parts_that_record_into_different_state_dirs_are_named(site: Path) -> None:
    """Found attacking a slurm.conf outside /etc/slurm: with slurm.conf elsewhere and dispatch.conf
    in /etc/slurm (step 3 said "copy it to /etc/slurm/dispatch.conf", step 4 "DISPATCH_CONF
    unless dispatch.conf is /etc/slurm/dispatch.conf"), slurmd's Prolog and Epilog, given
    SLURM_CONF, read the file beside it (none: the default StateDir) while the controller's
    parts and dispatch-cease read /etc/slurm/dispatch.conf: each execution's facts were split
    between two StateDirs and no hold ever lifted, yet every part recorded somewhere, so the
    doctor said every check passed.  Here the same split made by the parts' knobs (this host's
    /etc/slurm is not the test's): the Epilog's dispatch.conf names another StateDir."""
    other = site / "other"
    other.mkdir()
    state = site / "other-state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    (other / "dispatch.conf").write_text(f"StateDir={state}\n")
    install(site / "etc", sys.executable, other / "dispatch.conf", only=("epilog.d/05-dispatch",))
    code, report = diagnose(site, controller=True)
    assert states(report)["Prolog runs"] == states(report)["Epilog runs"] == "ok"  # each records
    assert code == 1, report
    found = check(report, "StateDirs")
    assert found["state"] == "FAIL", found
    etc = site / "etc"
    assert found["detail"] == (
        "the parts record into 2 StateDirs, so an execution's start and end are filed apart "
        "and dispatch-cease, which reads one, proves nothing: "
        f"{site}/state (Prolog, HealthCheckProgram, PrologSlurmctld: {etc}/dispatch.conf); "
        f"{state} (Epilog, EpilogSlurmctld: {other}/dispatch.conf)"
    ), found
    assert found["fix"] == (
        f"set DISPATCH_CONF={etc}/dispatch.conf at the top of {etc}/epilog.d/05-dispatch"
    ), found


def test_a_knob_set_again_below_is_read_as_the_shell_reads_it(site: Path) -> None:
    """Found attacking a slurm.conf outside /etc/slurm: an admin who sets DISPATCH_CONF on a line of
    its own below the shipped `DISPATCH_CONF=` (rather than editing that line) has a part that reads
    the file, as sh takes the last assignment; the doctor took the first, said 'DISPATCH_CONF
    is empty', looked for the controller's facts under the default StateDir and failed a part
    that works."""
    part = site / "etc/prolog.d/05-dispatch"
    conf = site / "etc/dispatch.conf"
    text = part.read_text()
    assert f"\nDISPATCH_CONF={conf}\n" in text
    part.write_text(
        text.replace(
            f"\nDISPATCH_CONF={conf}\n", f"\nDISPATCH_CONF=\nDISPATCH_CONF={conf}   # ours\n"
        )
    )
    code, report = diagnose(site, controller=True)
    assert code == 0, [c for c in report["checks"] if c["state"] != "ok"]
    assert check(report, "PrologSlurmctld runs")["state"] == "ok"

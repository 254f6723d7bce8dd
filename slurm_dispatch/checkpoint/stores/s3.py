"""The S3 publication store: a root ``s3://bucket/prefix``, publications under ``prefix/pub/``.

The same protocol as on POSIX, with S3's primitives:

* A publication is an empty object ``<prefix>/pub/<name>`` created with ``PutObject`` and
  ``If-None-Match: *``: the server creates it once or answers 412.  A 409 (a concurrent
  conditional create in flight, as AWS may answer) is retried with tenacity until the
  deadline.  Nothing here overwrites or copies.
* ``publish`` returns only when the publication is there, and says whose it is: each call
  sends a random token of its own as the object's metadata (``x-amz-meta-dispatch-call``).
  A 412 whose object holds this call's token is this call's own create, its answer lost and
  retried by botocore: published, returned as made.  A 412 for any other object (or one whose
  token cannot be read) is :class:`AlreadyPublished`: the name was there before this call.
  The name is the save's epoch, step and path, so it is the same save's publication either
  way; ``dispatch publish`` and the integrations take it as done (POSIX's O_EXCL has no lost
  answer, so there AlreadyPublished has the same meaning).
* ``latest`` and ``list_publications`` page through ``ListObjectsV2`` of ``<prefix>/pub/``
  with no delimiter, so a key in a deeper "folder" is seen too; any key that is not a
  publication name is an error naming it (only the folder marker ``pub/`` itself, which
  S3 consoles create, is not an entry).
* Every call runs against one deadline (``timeout`` seconds, :func:`within`): a scan that
  does not finish in time is :class:`StoreTimeout`, never a partial answer.  The worker
  thread's sockets time out on their own soon after, and it stops paging once abandoned.
* Endpoint, region and credentials come from boto3's usual chain (environment,
  ``~/.aws/config``, ``AWS_ENDPOINT_URL``); nothing of our own.  boto3 is imported only
  here, when an ``s3://`` root is used; a missing boto3 is an error naming the extra.
* ``publish`` makes exactly one request (a 412 adds one HEAD, to read whose it is): it does
  not check that the save exists (on S3 a "folder" is only a prefix, and a check would double
  publish's cost); the path must still lie under the root, in normal form.
* Only cleanup's methods delete (``DeleteObjects``, a thousand keys a request): a save is every
  key equal to its path or under it as a folder, plus its manifest beside it.  S3 cannot say
  beforehand whether a delete will be allowed (``check_removable`` checks nothing); a refused
  delete is an error naming the key, and cleanup's order keeps the store valid after it.
"""

from __future__ import annotations

import os
import secrets
import threading
from typing import Any, Callable, Iterator, Optional, TypeVar

from ...errors import StoreError, StoreTimeout
from .. import model
from .base import (
    EXEC,
    GC,
    PUB,
    S3_SCHEME,
    mark_part,
)
from .objects import (
    PUBLISH_UNFINISHED,
    ObjectRoot,
    ObjectStore,
    already_published,
    refused,
    split_root,
)
from .schemes import SCHEMES

_EXTRA = next(row.extra for row in SCHEMES if row.cls == "S3Store")  # the table's row
EXTRA_HINT = (
    f"install the '{_EXTRA}' extra into it: pip install "
    f"'slurm_dispatch-<version>-py3-none-any.whl[{_EXTRA}]' (the wheel make dist "
    "builds), or pip install boto3"
)
SDK = ("boto3", "botocore")


def refuse_without_sdk(quick: bool = False) -> None:
    """A StoreError in one line, naming the extra, where boto3 or botocore cannot be imported
    (an ``s3://`` root needs both; without them every S3 call would fail deep inside).

    ``quick`` (dispatch-sbatch, which never talks to S3): only look for the packages, not
    import them (importing boto3 costs about 100 ms).
    """
    import sys

    for name in SDK:
        if quick:
            import importlib.util

            try:
                missing = importlib.util.find_spec(name) is None
            except (ImportError, ValueError):
                missing = True
        else:
            try:
                __import__(name + (".exceptions" if name == "botocore" else ""))
                missing = False
            except ImportError:
                missing = True
        if missing:
            raise StoreError(
                f"an s3:// checkpoint root needs {name}, which {sys.executable} "
                f"cannot import: {EXTRA_HINT}"
            )


# Codes a server gives for a conditional create that raced another one in flight (AWS S3
# documents ConditionalRequestConflict); retrying settles it as a create or a 412.
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})
# The metadata key of a publication's call token (boto3 sends it as x-amz-meta-dispatch-call).
CALL_TOKEN = "dispatch-call"
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "InvalidToken",
        "ExpiredToken",
        "AuthorizationHeaderMalformed",
    }
)

T = TypeVar("T")


class S3Root(ObjectRoot):
    """A parsed ``s3://bucket/prefix`` root."""

    scheme = S3_SCHEME


def parse_root(root: str) -> S3Root:
    """Split ``s3://bucket/prefix``; refuse a root whose keys would not be one clean prefix."""
    return S3Root(*split_root(root, S3_SCHEME, "bucket"))


# --------------------------------------------------------------------------- boto3


_clients: dict[tuple[object, ...], Any] = {}
_clients_lock = threading.Lock()


def client_for(timeout: float) -> Any:
    """A boto3 S3 client whose sockets give up within ``timeout``; one per process for a given
    timeout and ``AWS_*`` environment (making one costs tens of milliseconds).  Every S3 call
    of the package goes through one of these (the store, :mod:`.transfer`, the integrations),
    so the timeouts, retries and connection pool are set here only."""
    key = (timeout, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            refuse_without_sdk()
            import boto3
            from botocore.config import Config

            socket_timeout = max(0.1, min(timeout, 30.0))
            config = Config(
                connect_timeout=socket_timeout,
                read_timeout=socket_timeout,
                retries={"mode": "standard", "max_attempts": 3},
                max_pool_connections=4,
            )
            client = boto3.session.Session().client("s3", config=config)
            _clients[key] = client
        return client


def store_error(exc: BaseException, action: str, where: str) -> StoreError:
    """A StoreError naming the bucket and key (``where``), the server's code and a hint: how
    every S3 failure of the package is told (``action`` is what was being done: "listing",
    "reading", ...)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {})
        code = error.get("Code", "?")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        text = f"{action} {where} failed: {code} (HTTP {status}): {error.get('Message', '')}"
        if code == "NoSuchBucket":
            text += f"; the bucket {where[len(S3_SCHEME) :].split('/', 1)[0]!r} does not exist"
        elif code in _CREDENTIAL_CODES:
            text += (
                "; check the credentials boto3 found (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/credentials)"
            )
        return StoreError(text.rstrip(": "))
    name = type(exc).__name__
    if name == "NoCredentialsError":
        return StoreError(
            f"{action} {where} failed: no S3 credentials found (set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or "
            "~/.aws/credentials)"
        )
    return StoreError(f"{action} {where} failed: {exc}")


def token_of(client: Any, bucket: str, key: str) -> Optional[str]:
    """The call token of the object at ``key`` (a publication, a create-once record; "" when
    it has none: made by hand or by an older release); None when it cannot be read."""
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except Exception:  # a lookup that says nothing either way
        return None
    return str(head.get("Metadata", {}).get(CALL_TOKEN, ""))


def within(
    timeout: float,
    what: str,
    call: Callable[[threading.Event], T],
    after: str = "an unfinished scan is an error, never a partial answer",
) -> T:
    """Run ``call(abandoned)`` in a worker thread and wait at most ``timeout`` seconds.

    Past the deadline, ``abandoned`` is set (the worker stops at its next page) and
    :class:`StoreTimeout` is raised: no partial answer ever leaves here.
    """
    abandoned = threading.Event()
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call(abandoned)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    # A daemon thread: a worker stuck in a socket read must not keep the process alive.
    threading.Thread(target=work, name="dispatch-s3", daemon=True).start()
    if not done.wait(timeout):
        abandoned.set()
        raise StoreTimeout(
            f"{what} did not finish within the timeout of {timeout:g} s (--timeout, "
            f"$DISPATCH_STORE_TIMEOUT or StoreTimeout in dispatch.conf); {after}"
        )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- the store


class S3Store(ObjectStore):
    """The :class:`~.base.Store` of an ``s3://bucket/prefix`` root."""

    _parse = staticmethod(parse_root)
    _refuse_without_sdk = staticmethod(refuse_without_sdk)

    # The interface ----------------------------------------------------------

    def publish(self, epoch: int, step: int, path: str) -> str:
        relative = self.relative(path)
        name = model.format_name(epoch, step, relative)
        key = self.pub_prefix + name
        url = f"{S3_SCHEME}{self.where.bucket}/{key}"
        within(
            self.timeout,
            f"publishing {url}",
            lambda _abandoned: self._create_once(
                key, url, f"(epoch {epoch}, step {step}, path {relative!r})"
            ),
            after=PUBLISH_UNFINISHED,
        )
        return name

    # S3 ---------------------------------------------------------------------

    def _pub_url(self) -> str:
        return f"{S3_SCHEME}{self.where.bucket}/{self.pub_prefix}"

    def _create_once(self, key: str, url: str, what: str) -> None:
        import tenacity
        from botocore.exceptions import BotoCoreError, ClientError

        client = client_for(self.timeout)
        token = secrets.token_hex(16)  # this call's own: a 412 on it is our lost answer

        def conflict(exc: BaseException) -> bool:
            return (
                isinstance(exc, ClientError)
                and exc.response.get("Error", {}).get("Code") in _CONFLICT_CODES
            )

        def create() -> None:
            client.put_object(**self._once(key, b"", token))

        try:
            try:
                create()  # the first try needs no retry machinery (publish's cost)
            except ClientError as exc:
                if not conflict(exc):
                    raise
                tenacity.Retrying(
                    retry=tenacity.retry_if_exception(conflict),
                    wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
                    stop=tenacity.stop_after_delay(self.timeout),
                    reraise=True,
                )(create)
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if error.get("Code") == "PreconditionFailed" or status == 412:
                error = already_published(url, what, self._token_of(client, key), token)
                if error is None:
                    return  # made by this call; botocore retried after its answer was lost
                raise error from None
            error = store_error(exc, "publishing", url)
            if refused(status):
                raise error from None
            raise StoreError(f"{error}; {PUBLISH_UNFINISHED}") from None
        except BotoCoreError as exc:  # no answer, after botocore's retries: one may have landed
            error = store_error(exc, "publishing", url)
            raise StoreError(f"{error}; {PUBLISH_UNFINISHED}") from None

    def _token_of(self, client: Any, key: str) -> Optional[str]:
        return token_of(client, self.where.bucket, key)

    def _once(self, key: str, body: bytes, token: str) -> dict[str, Any]:
        """PutObject's arguments creating ``key`` once, holding ``body`` and ``token``."""
        return {
            "Bucket": self.where.bucket,
            "Key": key,
            "Body": body,
            "IfNoneMatch": "*",
            "Metadata": {CALL_TOKEN: token},
        }

    def _put_once(self, client: Any, key: str, body: bytes) -> bool:
        """Create ``key`` once; False when it is there, not made by this call (a 412 on an
        object holding this call's token is its own create, the answer lost)."""
        from botocore.exceptions import ClientError

        token = secrets.token_hex(16)
        try:
            client.put_object(**self._once(key, body, token))
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                return self._token_of(client, key) == token
            raise
        return True

    def _pages(
        self, client: Any, request: dict[str, Any], url: str, abandoned: threading.Event
    ) -> Iterator[dict[str, Any]]:
        """Each page of a ListObjectsV2 listing, until the last one or ``abandoned``."""
        while not abandoned.is_set():
            page = client.list_objects_v2(**request)
            yield page
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                raise StoreError(
                    f"listing {url}: the server said the listing is truncated "
                    "but gave no continuation token"
                )
            request["ContinuationToken"] = token

    def _names(self) -> list[str]:
        return within(self.timeout, f"listing {self._pub_url()}", self._scan)

    def _scan(self, abandoned: threading.Event) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        client = client_for(self.timeout)
        prefix = self.pub_prefix
        cut = len(prefix)
        names: list[str] = []
        request: dict[str, Any] = {"Bucket": self.where.bucket, "Prefix": prefix}
        try:
            for page in self._pages(client, request, self._pub_url(), abandoned):
                names.extend(item["Key"][cut:] for item in page.get("Contents", ()))
        except ClientError as exc:
            raise store_error(exc, "listing", self._pub_url()) from None
        except BotoCoreError as exc:
            raise store_error(exc, "listing", self._pub_url()) from None
        # The folder marker "pub/" itself (an S3 console's "create folder") is not an entry.
        return [name for name in names if name != ""]

    # Cleanup's part ------------------------------------------------------------

    def _call(self, what: str, key: str, call: Callable[[Any], T]) -> T:
        """One request against the deadline; client errors name the key."""
        from botocore.exceptions import BotoCoreError, ClientError

        def run(_abandoned: threading.Event) -> T:
            try:
                return call(client_for(self.timeout))
            except (ClientError, BotoCoreError) as exc:
                raise store_error(exc, what, self._url(key)) from None

        return within(self.timeout, f"{what} {self._url(key)}", run)

    def _request(self, what: str, key: str, method: str, **kwargs: Any) -> Any:
        """``client.<method>(Bucket=..., **kwargs)`` against the deadline."""
        return self._call(
            what, key, lambda client: getattr(client, method)(Bucket=self.where.bucket, **kwargs)
        )

    def _objects(self, prefix: str, delimiter: str = "") -> list[tuple[str, int]]:
        """(key, size) of every object under ``prefix``, one scan against the deadline; with a
        ``delimiter``, the common prefixes too (size -1)."""
        from botocore.exceptions import BotoCoreError, ClientError

        request: dict[str, Any] = {"Bucket": self.where.bucket, "Prefix": prefix}
        if delimiter:
            request["Delimiter"] = delimiter
        url = self._url(prefix)

        def scan(abandoned: threading.Event) -> list[tuple[str, int]]:
            found: list[tuple[str, int]] = []
            try:
                for page in self._pages(client_for(self.timeout), request, url, abandoned):
                    found.extend(
                        (item["Key"], int(item.get("Size", 0))) for item in page.get("Contents", ())
                    )
                    found.extend(
                        (common["Prefix"], -1) for common in page.get("CommonPrefixes", ())
                    )
            except (ClientError, BotoCoreError) as exc:
                raise store_error(exc, "listing", url) from None
            return found

        return within(self.timeout, f"listing {url}", scan)

    def _delete_keys(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            answer = self._request(
                "deleting",
                batch[0],
                "delete_objects",
                Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
            )
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise StoreError(
                    f"deleting {self._url(first.get('Key', '?'))} failed: "
                    f"{first.get('Code', '?')}: {first.get('Message', '')}"
                    + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
                )

    def check_store(self) -> None:
        for part in (PUB, EXEC):
            prefix = self.where.key(part) + "/"
            page = self._request("listing", prefix, "list_objects_v2", Prefix=prefix, MaxKeys=1)
            if page.get("Contents"):
                return
        raise StoreError(
            f"{self.root!r} is not a checkpoint root (nothing under pub/ or "
            "exec/); refusing to clean it"
        )

    def has_publication(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        key = self.pub_prefix + name

        def head(client: Any) -> bool:
            try:
                client.head_object(Bucket=self.where.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                    return False
                raise
            return True

        return self._call("reading", key, head)

    def read_exec_file(self, attempt: str, name: str) -> Optional[bytes]:
        from botocore.exceptions import ClientError

        key = self.where.key(f"{EXEC}/{attempt}/{name}")

        def get(client: Any) -> Optional[bytes]:
            try:
                answer = client.get_object(Bucket=self.where.bucket, Key=key)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            return answer["Body"].read()  # type: ignore[no-any-return]

        return self._call("reading", key, get)

    def create_exec_file(self, attempt: str, name: str, data: bytes) -> None:
        key = self.where.key(f"{EXEC}/{model.check_attempt(attempt)}/{name}")

        def put(client: Any) -> None:
            if not self._put_once(client, key, data):
                raise FileExistsError(f"{self._url(key)} already exists")

        self._call("creating", key, put)

    def exists(self, relative: str) -> bool:
        key = self.where.key(relative)
        page = self._request("listing", key, "list_objects_v2", Prefix=key + "/", MaxKeys=1)
        if page.get("Contents"):
            return True
        page = self._request("listing", key, "list_objects_v2", Prefix=key, MaxKeys=1)
        return any(item["Key"] == key for item in page.get("Contents", ()))

    def create_intents(self, names: list[str]) -> None:
        for name in names:
            key = self.where.key(f"{GC}/{name}")
            self._request("creating", key, "put_object", Key=key, Body=b"")

    def create_mark(self, part: str, entry: str) -> bool:
        key = self.where.key(f"{mark_part(part)}/{entry}")
        return self._call("creating", key, lambda client: self._put_once(client, key, b""))

    def exec_entries(self) -> dict[str, list[str]]:
        # One listing of exec/ (paged) rather than one per folder.
        prefix = self.where.key(EXEC) + "/"
        out: dict[str, set[str]] = {}
        for key, _size in self._objects(prefix):
            rest = key[len(prefix) :]
            attempt, _, inside = rest.partition("/")
            if not attempt or not inside:
                continue
            head, slash, _tail = inside.partition("/")
            out.setdefault(attempt, set()).add(head + slash)
        return {attempt: sorted(names) for attempt, names in out.items()}

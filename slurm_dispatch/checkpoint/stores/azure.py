"""The Azure Blob publication store: a root ``az://container/prefix``, publications under
``prefix/pub/``, the same protocol as S3's (:mod:`.s3`) with Azure's primitives:

* A publication is an empty block blob ``<prefix>/pub/<name>`` put with ``If-None-Match: *``
  (``upload_blob(overwrite=False)``): the service creates it once or answers 409
  ``BlobAlreadyExists``.  Each call puts a random token of its own in the blob's metadata, so
  a 409 on a blob holding this call's token is this call's own create whose answer was lost
  and retried by the SDK: published.  Any other 409 is :class:`AlreadyPublished` (one whose
  token cannot be read says it may be this call's own, as S3's does).
* Listing a container is strongly consistent; ``latest`` pages through every blob under
  ``<prefix>/pub/`` with no delimiter, and any name that is not a publication is an error.
* Every call runs against one deadline (:func:`.s3.within`), a scan that does not finish in
  time is :class:`StoreTimeout`, never a partial answer.
* The account comes from ``$AZURE_STORAGE_CONNECTION_STRING`` (the SDK's own convention);
  azure-storage-blob is imported only here, when an ``az://`` root is opened.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
from typing import Any, Callable, Optional, TypeVar

from ...errors import OutsideRoot, StoreError, UsageError
from .. import model
from .base import (
    EXEC,
    GC,
    PUB,
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
from .s3 import within

SCHEME = "az://"
CONNECTION_ENV = "AZURE_STORAGE_CONNECTION_STRING"
CALL_TOKEN = "dispatch_call"  # metadata names are C# identifiers: no '-'
SDK = "azure.storage.blob"

T = TypeVar("T")


class AzureRoot(ObjectRoot):
    """A parsed ``az://container/prefix`` root."""

    scheme = SCHEME


# A container's name: 3 to 63 lower-case letters, digits and single hyphens, a letter or digit
# at each end; or one of the account's own containers.
CONTAINER = re.compile(r"(?:[a-z0-9](?:-?[a-z0-9]){2,62}|\$root|\$web|\$logs)")


def parse_root(root: str) -> AzureRoot:
    """Split ``az://container/prefix``; refuse a container name Azure cannot have and a prefix
    that is not in normal form."""
    container, prefix = split_root(root, SCHEME, "container")
    if not CONTAINER.fullmatch(container) or len(container) > 63:
        raise UsageError(
            f"checkpoint root {root!r}: {container!r} cannot be an Azure container's name "
            "(3 to 63 lower-case letters, digits and single hyphens, a letter or digit at "
            "each end)"
        )
    if "\\" in prefix:
        raise UsageError(f"checkpoint root {root!r}: {BACKSLASH}")
    return AzureRoot(container, prefix)


def refuse_without_sdk(quick: bool = False) -> None:
    """A StoreError naming the extra where azure-storage-blob is missing."""
    import importlib.util

    try:
        missing = importlib.util.find_spec(SDK) is None
    except (ImportError, ValueError):
        missing = True
    if missing:
        raise StoreError(
            "an az:// checkpoint root needs azure-storage-blob: install the 'azure' extra "
            "(pip install 'slurm-dispatch[azure]')"
        )


# The service stores a '\' in a blob's name as '/' (Azurite as Azure): refused, not moved.
BACKSLASH = "Azure Blob stores a '\\' in a blob's name as '/': it would not be found under it"

BATCH = 256  # the most blobs one Blob Batch request may delete (the service's limit)

_clients: dict[tuple[object, ...], Any] = {}
_clients_lock = threading.Lock()


def container_for(container: str, timeout: float) -> Any:
    """A ContainerClient of ``container`` whose sockets give up within ``timeout``."""
    conn = os.environ.get(CONNECTION_ENV, "")
    if not conn:
        raise StoreError(f"an az:// checkpoint root needs ${CONNECTION_ENV} (the account)")
    key = (container, timeout, conn)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            refuse_without_sdk()
            from azure.storage.blob import BlobServiceClient

            socket_timeout = max(0.1, min(timeout, 30.0))
            try:
                service = BlobServiceClient.from_connection_string(
                    conn,
                    connection_timeout=socket_timeout,
                    read_timeout=socket_timeout,
                    retry_total=3,
                    # Its retries (a lost answer's among them) wait about 1, 3, then 5 s, not its
                    # default 15, 18, 24: the first lands well inside a short --timeout.
                    initial_backoff=1,
                    increment_base=2,
                    random_jitter_range=1,
                )
            except ValueError as exc:  # the SDK's words name no variable (nor the key)
                raise StoreError(f"${CONNECTION_ENV} is not a connection string: {exc}") from None
            client = service.get_container_client(container)
            _clients[key] = client
        return client


def store_error(exc: BaseException, action: str, where: str) -> StoreError:
    from azure.core.exceptions import ClientAuthenticationError

    code = getattr(exc, "error_code", None)
    code = getattr(code, "value", code)  # the service's own code, not the SDK's enum's name
    status = getattr(exc, "status_code", None)
    said = f"{code} (HTTP {status})" if code or status else f"{exc}"
    text = f"{action} {where} failed: {said}"
    if status in (401, 403) or isinstance(exc, ClientAuthenticationError):
        text += f"; check the account name and key in ${CONNECTION_ENV}"
    return StoreError(text)


def read_blob(client: Any, key: str) -> Optional[bytes]:
    """The bytes of the blob ``key``; None when there is no such blob (a container that is
    not there is an error, as S3's NoSuchBucket is)."""
    from azure.core.exceptions import ResourceNotFoundError

    try:
        return bytes(client.download_blob(key).readall())
    except ResourceNotFoundError as exc:
        code = getattr(exc, "error_code", None)
        if getattr(code, "value", code) == "BlobNotFound":
            return None
        raise


class AzureStore(ObjectStore):
    """The :class:`~.base.Store` of an ``az://container/prefix`` root."""

    _parse = staticmethod(parse_root)
    _refuse_without_sdk = staticmethod(refuse_without_sdk)

    def _call(
        self, what: str, key: str, call: Callable[[Any], T], after: Optional[str] = None
    ) -> T:
        """One request against the deadline (``after``: what running past it means, where
        not the default; said too when the SDK's retries ran out with no refusal of the
        request itself, as that may have been applied); service errors name the blob."""
        from azure.core.exceptions import AzureError

        def run(_abandoned: threading.Event) -> T:
            try:
                return call(container_for(self.where.bucket, self.timeout))
            except AzureError as exc:
                error = store_error(exc, what, self._url(key))
                if after is not None and not refused(getattr(exc, "status_code", None)):
                    raise StoreError(f"{error}; {after}") from None
                raise error from None

        if after is None:
            return within(self.timeout, f"{what} {self._url(key)}", run)
        return within(self.timeout, f"{what} {self._url(key)}", run, after=after)

    # The interface ----------------------------------------------------------

    def relative(self, path: str) -> str:
        relative = super().relative(path)
        if "\\" in relative:
            raise OutsideRoot(f"save {path!r}: {BACKSLASH}")
        return relative

    def publish(self, epoch: int, step: int, path: str) -> str:
        relative = self.relative(path)
        name = model.format_name(epoch, step, relative)
        key = self.pub_prefix + name
        token = secrets.token_hex(16)
        if not self._call(
            "publishing",
            key,
            lambda c: self._put_once(c, key, b"", token),
            after=PUBLISH_UNFINISHED,
        ):
            whose = self._call("reading", key, lambda c: self._token_of(c, key))
            what = f"(epoch {epoch}, step {step}, path {relative!r})"
            error = already_published(self._url(key), what, whose, token)
            if error is not None:
                raise error
        return name

    @staticmethod
    def _put_once(client: Any, key: str, data: bytes, token: str = "") -> bool:
        """Create the blob ``key`` once; False when it exists (409 BlobAlreadyExists; another
        409, a container being deleted, is an error, not a blob there)."""
        from azure.core.exceptions import ResourceExistsError

        try:
            client.upload_blob(
                key, data, overwrite=False, metadata={CALL_TOKEN: token} if token else None
            )
        except ResourceExistsError as exc:
            code = getattr(exc, "error_code", None)
            if getattr(code, "value", code) != "BlobAlreadyExists":
                raise
            return False
        return True

    @staticmethod
    def _create_once(client: Any, key: str, data: bytes) -> bool:
        """Create the blob ``key`` once; False when another call made it (a conflict on a blob
        holding this call's token is its own create, its answer lost)."""
        token = secrets.token_hex(16)
        made = AzureStore._put_once(client, key, data, token)
        return made or AzureStore._token_of(client, key) == token

    @staticmethod
    def _token_of(client: Any, key: str) -> Optional[str]:
        try:
            metadata = client.get_blob_client(key).get_blob_properties().metadata or {}
        except Exception:  # a lookup that says nothing either way
            return None
        return str(metadata.get(CALL_TOKEN, ""))

    # Listings ---------------------------------------------------------------

    def _objects(self, prefix: str, delimiter: str = "") -> list[tuple[str, int]]:
        """(name, size) of every blob under ``prefix``; with a ``delimiter``, the common
        prefixes too (size -1).  One scan against the deadline."""
        from azure.core.exceptions import AzureError
        from azure.storage.blob import BlobPrefix

        url = self._url(prefix)

        def scan(abandoned: threading.Event) -> list[tuple[str, int]]:
            client = container_for(self.where.bucket, self.timeout)
            found: list[tuple[str, int]] = []
            try:
                items = (
                    client.walk_blobs(name_starts_with=prefix, delimiter=delimiter)
                    if delimiter
                    else client.list_blobs(name_starts_with=prefix)
                )
                for item in items:
                    if abandoned.is_set():
                        break
                    folder = isinstance(item, BlobPrefix)
                    found.append((item.name, -1 if folder else int(item.size)))
            except AzureError as exc:
                raise store_error(exc, "listing", url) from None
            return found

        return within(self.timeout, f"listing {url}", scan)

    def _delete_keys(self, keys: list[str]) -> None:
        """Delete in Blob Batch requests of :data:`BATCH` blobs (as the S3 store does in
        DeleteObjects of 1,000): one request a blob made a cleanup of a big save hundreds of
        requests.  A blob already gone (404) is fine; any other refusal names the blob, after
        the rest of its batch is deleted."""
        for start in range(0, len(keys), BATCH):
            batch = keys[start : start + BATCH]

            def delete(client: Any, batch: list[str] = batch) -> list[tuple[str, int, str]]:
                answers = client.delete_blobs(*batch, raise_on_any_failure=False)
                return [
                    (key, int(answer.status_code), answer.headers.get("x-ms-error-code") or "?")
                    for key, answer in zip(batch, answers)
                ]

            refused = [
                (key, status, code)
                for key, status, code in self._call("deleting", batch[0], delete)
                if status not in (200, 202, 204, 404)
            ]
            if refused:
                key, status, code = refused[0]
                more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
                raise StoreError(f"deleting {self._url(key)} failed: {code} (HTTP {status}){more}")

    # Cleanup's part ------------------------------------------------------------

    def check_store(self) -> None:
        for part in (PUB, EXEC):
            if self._objects(self.where.key(part) + "/"):
                return
        raise StoreError(
            f"{self.root!r} is not a checkpoint root (nothing under pub/ or exec/); "
            "refusing to clean it"
        )

    def has_publication(self, name: str) -> bool:
        key = self.pub_prefix + name
        return bool(self._call("reading", key, lambda c: c.get_blob_client(key).exists()))

    def read_exec_file(self, attempt: str, name: str) -> Optional[bytes]:
        key = self.where.key(f"{EXEC}/{attempt}/{name}")
        return self._call("reading", key, lambda c: read_blob(c, key))

    def create_exec_file(self, attempt: str, name: str, data: bytes) -> None:
        key = self.where.key(f"{EXEC}/{model.check_attempt(attempt)}/{name}")
        if not self._call("creating", key, lambda c: self._create_once(c, key, data)):
            raise FileExistsError(f"{self._url(key)} already exists")

    def exists(self, relative: str) -> bool:
        key = self.where.key(relative)
        return any(k == key or k.startswith(key + "/") for k, _size in self._objects(key))

    def create_intents(self, names: list[str]) -> None:
        for name in names:
            key = self.where.key(f"{GC}/{name}")
            self._call("creating", key, lambda c, key=key: c.upload_blob(key, b"", overwrite=True))  # type: ignore[misc]

    def create_mark(self, part: str, entry: str) -> bool:
        key = self.where.key(f"{mark_part(part)}/{entry}")
        return self._call("creating", key, lambda c: self._create_once(c, key, b""))


# The transfers (stores/remote.py): saves between local disk and an az:// URL ------------


def _place(url: str) -> tuple[str, str]:
    if "\\" in url:
        raise StoreError(f"{url!r}: {BACKSLASH}")
    where = parse_root(url)
    if not where.prefix:
        raise StoreError(f"{url!r} names a container, not a save under it")
    return where.bucket, where.prefix


def _transfer(
    url: str, timeout: float, what: str, call: Callable[[Any, str, threading.Event], T]
) -> T:
    """``call(container client, key, abandoned)`` against the deadline (past it ``abandoned``
    is set: a call of many requests makes no more); failures name ``url``."""
    from azure.core.exceptions import AzureError

    container, key = _place(url)

    def run(abandoned: threading.Event) -> T:
        try:
            return call(container_for(container, timeout), key, abandoned)
        except AzureError as exc:
            raise store_error(exc, what, url) from None

    return within(timeout, f"{what} {url}", run, after="an unfinished transfer is an error")


def put_json_once(url: str, data: dict[str, Any], timeout: float) -> bool:
    body = (json.dumps(data, sort_keys=True) + "\n").encode()
    return _transfer(
        url, timeout, "writing", lambda c, key, _: AzureStore._create_once(c, key, body)
    )


def read_json(url: str, timeout: float) -> Optional[Any]:
    body = _transfer(url, timeout, "reading", lambda c, key, _: read_blob(c, key))
    try:
        return None if body is None else json.loads(body)
    except ValueError:
        return None


def upload_save(local: str, url: str, timeout: float) -> dict[str, int]:
    from .remote import local_files

    files = local_files(local)
    if not files:
        raise StoreError(f"save {local!r} holds no regular file to upload")
    for name, _full in files:
        if "\\" in name:
            raise StoreError(f"cannot upload {name!r} of the save {local!r} to {url}: {BACKSLASH}")
    folder = os.path.isdir(local)

    def put(client: Any, key: str, abandoned: threading.Event) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for name, full in files:
            if abandoned.is_set():
                break
            sizes[name] = os.lstat(full).st_size
            with open(full, "rb") as data:
                client.upload_blob(
                    f"{key}/{name}" if folder else key, data, overwrite=True, max_concurrency=4
                )
        return sizes

    return _transfer(url, timeout, f"uploading {local} to", put)


def save_listing(url: str, timeout: float) -> tuple[bool, dict[str, tuple[int, str]]]:
    def scan(client: Any, key: str, _: threading.Event) -> tuple[bool, dict[str, tuple[int, str]]]:
        base = key.rsplit("/", 1)[-1]
        inside: dict[str, tuple[int, str]] = {}
        whole: dict[str, tuple[int, str]] = {}
        for item in client.list_blobs(name_starts_with=key):
            found = (int(item.size), str(item.etag))
            if item.name == key:
                whole[base] = found
            elif item.name.startswith(key + "/") and not item.name.endswith("/"):
                inside[item.name[len(key) + 1 :]] = found
        return (True, inside) if inside else (False, whole)

    return _transfer(url, timeout, "listing the save", scan)


def fetch_save(url: str, local: str, timeout: float) -> str:
    from .remote import check_fetched, fetch_targets

    folder, listed = save_listing(url, timeout)
    targets = fetch_targets(url, local, folder, {name: size for name, (size, _) in listed.items()})

    def get(client: Any, key: str, abandoned: threading.Event) -> None:
        for name, target, _size in targets:
            if abandoned.is_set():
                break
            try:
                with open(target, "xb") as out:
                    client.download_blob(f"{key}/{name}" if name else key).readinto(out)
            except OSError as exc:  # as S3's transfers say a local failure
                raise StoreError(f"fetching {url} to {local} failed at {name!r}: {exc}") from None

    _transfer(url, timeout, f"fetching to {local}", get)
    check_fetched(url, targets)
    return local

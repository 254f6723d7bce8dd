"""Saves between local disk and an S3 prefix, with boto3's transfer manager.

:func:`upload_save` puts a local save (a folder, or one file) under an ``s3://`` URL;
:func:`fetch_save` brings one back to local disk; :func:`save_objects` lists what a save holds
on S3.  ``dispatch watch`` and the framework integrations use them for S3 roots.

Invariants:

* The bytes move through boto3's transfer manager (``boto3.s3.transfer``): multipart above
  its threshold, several parts and files at once.  Nothing here is hand-made multipart.
* Each transfer runs against one deadline (``timeout`` seconds from its start): past it, the
  transfer's futures are cancelled and :class:`StoreTimeout` is raised, naming the save and
  the timeout.  A transfer that fails names the file, the bucket and key and the server's code.
* Nothing here publishes, overwrites a publication or deletes anything on S3; symlinks in a
  local save are never followed (they are not uploaded).  A fetched save is complete when
  this returns: every object is on disk at its listed size.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Optional

from ...errors import StoreError, StoreTimeout
from .base import S3_SCHEME
from .remote import check_fetched, fetch_targets, local_files
from .s3 import CALL_TOKEN, client_for, parse_root, store_error, token_of

# Parts of 8 MiB, four at once: the client keeps four connections (s3.client_for).
CONCURRENCY = 4
PART_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class Place:
    """An ``s3://bucket/key`` URL split; ``key`` has no slash at either end."""

    bucket: str
    key: str

    @classmethod
    def of(cls, url: str) -> Place:
        root = parse_root(url)
        if not root.prefix:
            raise StoreError(f"{url!r} names a bucket, not a save under it")
        return cls(root.bucket, root.prefix)

    def url(self, key: Optional[str] = None) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.key if key is None else key}"


def put_json_once(url: str, data: dict[str, Any], timeout: float) -> bool:
    """Create the object ``url`` holding ``data`` as JSON, once (``If-None-Match: *``); False
    when it exists (not when it holds this call's token: its own create, the answer lost)."""
    from botocore.exceptions import ClientError

    place = Place.of(url)
    client = client_for(timeout)
    token = secrets.token_hex(16)
    try:
        client.put_object(
            Bucket=place.bucket,
            Key=place.key,
            IfNoneMatch="*",
            Body=(json.dumps(data, sort_keys=True) + "\n").encode(),
            Metadata={CALL_TOKEN: token},
        )
    except ClientError as exc:
        if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
            return token_of(client, place.bucket, place.key) == token
        raise store_error(exc, "writing", url) from None
    return True


def read_json(url: str, timeout: float) -> Optional[Any]:
    """The JSON object at ``url``; None when there is none or it does not parse."""
    from botocore.exceptions import ClientError

    place = Place.of(url)
    try:
        body = client_for(timeout).get_object(Bucket=place.bucket, Key=place.key)["Body"].read()
        return json.loads(body)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise store_error(exc, "reading", url) from None
    except ValueError:
        return None


class _Countdown:
    """Sets ``done`` once every one of ``count`` transfers has ended (either way)."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.done = threading.Event()
        self.lock = threading.Lock()
        if count == 0:
            self.done.set()

    def subscriber(self) -> Any:
        from boto3.s3.transfer import BaseSubscriber

        countdown = self

        class Done(BaseSubscriber):  # type: ignore[misc]
            def on_done(self, future: Any, **kwargs: Any) -> None:
                with countdown.lock:
                    countdown.left -= 1
                    if countdown.left == 0:
                        countdown.done.set()

        return Done()


def _manager(timeout: float) -> Any:
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    config = TransferConfig(
        multipart_threshold=PART_SIZE,
        multipart_chunksize=PART_SIZE,
        max_concurrency=CONCURRENCY,
        use_threads=True,
    )
    return create_transfer_manager(client_for(timeout), config)


def _run(what: str, timeout: float, submit: list[tuple[str, Any]]) -> None:
    """Start every transfer of ``submit`` (label, start function taking a subscriber) and wait
    for all of them within ``timeout``; the first failure is raised, naming its label."""
    from botocore.exceptions import BotoCoreError, ClientError

    manager = _manager(timeout)
    countdown = _Countdown(len(submit))
    futures = []
    try:
        for label, start in submit:
            futures.append((label, start(manager, countdown.subscriber())))
        if not countdown.done.wait(timeout):
            for _label, future in futures:
                future.cancel()
            raise StoreTimeout(
                f"{what} did not finish within the timeout of {timeout:g} s; "
                "an unfinished transfer is an error"
            )
        for label, future in futures:
            try:
                future.result()
            except ClientError as exc:
                raise store_error(exc, what + ":", label) from None
            except (BotoCoreError, OSError) as exc:
                raise StoreError(f"{what} failed at {label}: {exc}") from None
            except Exception as exc:  # s3transfer wraps some failures in its own types
                raise StoreError(f"{what} failed at {label}: {exc}") from None
    finally:
        if countdown.done.is_set():
            manager.shutdown()
        # else: its threads end once their sockets give up; waiting here would hang too.


def upload_save(local: str, url: str, timeout: float) -> dict[str, int]:
    """Upload the save at ``local`` to ``url`` (a folder's files under ``url/``, a file at
    ``url``); return each uploaded object's name (relative to ``url``; a file save: its base
    name) and size."""
    place = Place.of(url)
    files = local_files(local)
    if not files:
        raise StoreError(f"save {local!r} holds no regular file to upload")
    folder = os.path.isdir(local)
    sizes: dict[str, int] = {}
    submit = []
    for name, full in files:
        sizes[name] = os.lstat(full).st_size
        key = f"{place.key}/{name}" if folder else place.key

        def start(manager: Any, subscriber: Any, full: str = full, key: str = key) -> Any:
            return manager.upload(full, place.bucket, key, subscribers=[subscriber])

        submit.append((place.url(key), start))
    _run(f"uploading {local} to {url}", timeout, submit)
    return sizes


def save_objects(url: str, timeout: float) -> tuple[bool, dict[str, int]]:
    """What the save at ``url`` holds on S3: (whether it is a folder, each object's name and
    size).  A folder save's names are relative to ``url/``; a file save (an object at ``url``
    itself) is one entry named by its base name.  Nothing found: ``(False, {})``."""
    folder, listed = save_listing(url, timeout)
    return folder, {name: size for name, (size, _etag) in listed.items()}


def save_listing(url: str, timeout: float) -> tuple[bool, dict[str, tuple[int, str]]]:
    """As :func:`save_objects`, each object with its size and its ETag (which changes when
    the object is replaced by other bytes, whatever their size)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from .s3 import within

    place = Place.of(url)
    base = place.key.rsplit("/", 1)[-1]

    def scan(abandoned: threading.Event) -> tuple[bool, dict[str, tuple[int, str]]]:
        client = client_for(timeout)
        inside: dict[str, tuple[int, str]] = {}
        whole: dict[str, tuple[int, str]] = {}
        # One listing of the bare key's prefix sees both shapes (and siblings such as
        # checkpoint-50 beside checkpoint-5, which are neither).
        request: dict[str, Any] = {"Bucket": place.bucket, "Prefix": place.key}
        try:
            while not abandoned.is_set():
                page = client.list_objects_v2(**request)
                for item in page.get("Contents", ()):
                    key, found = item["Key"], (int(item["Size"]), str(item.get("ETag", "")))
                    if key == place.key:
                        whole[base] = found
                    elif key.startswith(place.key + "/") and not key.endswith("/"):
                        inside[key[len(place.key) + 1 :]] = found
                if not page.get("IsTruncated"):
                    break
                request["ContinuationToken"] = page["NextContinuationToken"]
        except (ClientError, BotoCoreError) as exc:
            raise store_error(exc, "listing", url) from None
        return (True, inside) if inside else (False, whole)

    return within(timeout, f"listing the save {url}", scan)


def fetch_save(url: str, local: str, timeout: float) -> str:
    """Download the save at ``url`` to ``local`` (which must not exist) within ``timeout``;
    return ``local`` (a folder, or the file of a file save)."""
    place = Place.of(url)
    folder, objects = save_objects(url, timeout)
    targets = fetch_targets(url, local, folder, objects)
    submit = []
    for name, target, _size in targets:
        key = f"{place.key}/{name}" if name else place.key

        def start(manager: Any, subscriber: Any, key: str = key, target: str = target) -> Any:
            return manager.download(place.bucket, key, target, subscribers=[subscriber])

        submit.append((place.url(key), start))
    _run(f"fetching {url} to {local}", timeout, submit)
    check_fetched(url, targets)
    return local

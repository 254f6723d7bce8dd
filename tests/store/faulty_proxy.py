"""An HTTP proxy in front of the real S3 server that answers chosen requests itself.

Some answers a real store gives cannot be provoked on SeaweedFS (AWS's 409
``ConditionalRequestConflict`` for a conditional create racing another in flight, a 500 from a
sick server).  This proxy forwards every request byte for byte (the ``Host`` header too, so
SigV4 signatures still verify) and replaces the answer to the next ``n`` requests matching a
method with a canned S3 error, so the store's handling of them runs against real HTTP.
:meth:`FaultyProxy.drop_answer_next` forwards a request, lets the server apply it, then closes
the connection without answering (an answer lost on the network after the fact).
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FaultyProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults: list[tuple[str, int, str]] = []  # (method, status, code), used in order
        self.drops: list[tuple[str, str]] = []  # (method, part of the path), used in order
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status answered; 0: dropped)
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take(self.command)
                if fault is not None:
                    status, code = fault
                    payload = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}'
                        f"</Code><Message>injected by the test proxy</Message></Error>"
                    ).encode()
                    self._answer(status, {"Content-Type": "application/xml"}, payload)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items()}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                    if proxy._take_drop(self.command, self.path):
                        with proxy.lock:
                            proxy.seen.append((self.command, self.path, 0))
                        self.close_connection = True  # applied upstream, never answered
                        return
                    kept = {
                        k: v
                        for k, v in response.getheaders()
                        if k.lower() not in ("transfer-encoding", "connection", "content-length")
                    }
                    self._answer(response.status, kept, data)
                finally:
                    conn.close()

            def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
                with proxy.lock:
                    proxy.seen.append((self.command, self.path, status))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail_next(self, method: str, status: int, code: str, times: int = 1) -> None:
        with self.lock:
            self.faults.extend([(method, status, code)] * times)

    def drop_answer_next(self, method: str, path_contains: str = "", times: int = 1) -> None:
        """Forward the next ``times`` requests of ``method`` whose path holds
        ``path_contains``, then close the connection without answering them."""
        with self.lock:
            self.drops.extend([(method, path_contains)] * times)

    def _take_drop(self, method: str, path: str) -> bool:
        with self.lock:
            for i, (m, part) in enumerate(self.drops):
                if m == method and part in path:
                    del self.drops[i]
                    return True
        return False

    def _take(self, method: str) -> tuple[int, str] | None:
        with self.lock:
            for i, (m, status, code) in enumerate(self.faults):
                if m == method:
                    del self.faults[i]
                    return status, code
        return None

    def __enter__(self) -> FaultyProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.faults.clear()
            self.drops.clear()
        self.server.shutdown()
        self.server.server_close()

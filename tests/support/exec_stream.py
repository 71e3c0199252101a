"""A streaming caller of the workspace agent's ``EXEC`` route for tests and benchmarks: posts
the request with ``http.client`` and yields the NDJSON events as they arrive."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

from sandbox_core.agent import wire


class ExecStream:
    """One ``POST .../exec``: ``status``, ``headers``, then iterate :meth:`events`."""

    def __init__(
        self,
        url: str,
        token: str,
        sandbox_id: str,
        body: dict[str, Any],
        request_id: str | None,
        frames: bool = False,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": wire.JSON_CONTENT_TYPE,
        }
        if request_id is not None:
            headers[wire.REQUEST_ID_HEADER] = request_id
        if frames:
            headers["Accept"] = wire.FRAMES_CONTENT_TYPE
        self.connection.request(
            "POST", wire.EXEC.path(sid=sandbox_id), json.dumps(body).encode(), headers
        )
        self.response = self.connection.getresponse()
        self.status = self.response.status
        self.headers = self.response.headers

    def json(self) -> Any:
        """A non-streamed reply (a refusal)."""
        return json.loads(self.response.read())

    def events(self) -> Iterator[dict[str, Any]]:
        """The NDJSON events, each as it arrives."""
        while line := self.response.readline():
            yield json.loads(line)

    def frames(self) -> Iterator[tuple[bytes, bytes]]:
        """The frames (``Accept: wire.FRAMES_CONTENT_TYPE``): ``(tag, payload)`` each."""
        while header := self.response.read(5):
            size = int.from_bytes(header[1:], "big")
            payload = self.response.read(size)
            yield header[:1], payload

    def close(self) -> None:
        self.connection.close()


def post_json(
    url: str, token: str, path: str, body: dict[str, Any], request_id: str
) -> tuple[int, Any]:
    """A plain JSON POST: ``(status, decoded body)``."""
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    try:
        connection.request(
            "POST",
            path,
            json.dumps(body).encode(),
            {
                "Authorization": f"Bearer {token}",
                "Content-Type": wire.JSON_CONTENT_TYPE,
                wire.REQUEST_ID_HEADER: request_id,
            },
        )
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"null")
    finally:
        connection.close()

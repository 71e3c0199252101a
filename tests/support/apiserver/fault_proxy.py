"""An HTTP proxy between the operator and the tier-2 API server that injects API faults.

Issue 11, "Scale under faults": mocks only to inject faults, the API server behind stays real.
The operator gets a kubeconfig pointing at ``http://127.0.0.1:<port>`` (no credentials); the
proxy forwards every request over verified TLS as the admin user and, at ``rate`` (seeded, so a
run is repeatable), answers instead:

- ``429 Too Many Requests`` with ``Retry-After: 1`` (what API priority and fairness sends),
- ``500 Internal Server Error``,
- ``409 Conflict`` for creates (POST: "already exists") and for writes that carry a
  ``resourceVersion`` (an optimistic-concurrency loss); the first such request always gets one.
  A real API server answers 409 only to those: merge patches without a resourceVersion (kopf's
  patches, the PlanCommit journal) never conflict, so they get only 429s and 500s;

and ends every watch stream abruptly after a random 0.5-3 s (a dropped connection: no final
chunk). ``counts`` says what was injected and what was forwarded (by method): with ``rate=0``,
no watch drops and no first conflict it is a counter of the operator's API round trips. Use::

    with ApiFaultProxy(local_apiserver, rate=0.1) as proxy:
        OperatorProcess(proxy, namespace, work)   # proxy.env() points KUBECONFIG at the proxy
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self

import aiohttp
from aiohttp import web

from tests.support.apiserver.harness import LocalApiServer, free_port

_WRITES = {"POST", "PUT", "PATCH", "DELETE"}
# Hop-by-hop and length headers are the proxy's own business on each side.
_SKIP_HEADERS = {"host", "connection", "transfer-encoding", "content-length", "keep-alive"}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
        **({"details": {"retryAfterSeconds": 1}} if code == 429 else {}),
    }


class ApiFaultProxy:
    """See the module docstring. Stands in for a `LocalApiServer` where only ``env()``,
    ``kubeconfig_path`` and ``server_url`` are used (e.g. ``OperatorProcess``)."""

    def __init__(
        self,
        server: LocalApiServer,
        rate: float = 0.1,
        seed: int = 11,
        drop_watch_after: tuple[float, float] = (0.5, 3.0),
        first_write_conflicts: bool = True,
    ) -> None:
        self.server = server
        self.rate = rate
        self.random = random.Random(seed)
        self.drop_watch_after = drop_watch_after
        self.first_write_conflicts = first_write_conflicts
        self.counts: Counter[str] = Counter()
        self.port = free_port()
        self.server_url = f"http://127.0.0.1:{self.port}"
        self.kubeconfig_path = server.work_dir / f"fault-proxy-{self.port}.kubeconfig"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._watches: set[asyncio.Task[Any]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Listen on 127.0.0.1 and write the operator's kubeconfig."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": self.server_url}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [
                {"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}},
            ],
            "current-context": "proxy",
        }
        self.kubeconfig_path.write_text(json.dumps(config))

    async def _start(self) -> None:
        ssl_context = self.server._ssl_context()  # the harness's admin TLS client context
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def stop(self) -> None:
        """Stop listening; idempotent."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            # Watches never end by themselves: cancel their handlers before the server waits.
            for task in list(self._watches):
                task.cancel()
            if self._session is not None:
                await self._session.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The API server's environment with ``KUBECONFIG`` pointing at the proxy."""
        env = self.server.env(base)
        env["KUBECONFIG"] = str(self.kubeconfig_path)
        return env

    # -- proxying -----------------------------------------------------------------------------

    def _fault(self, request: web.Request, body: bytes) -> int | None:
        versioned = request.method == "POST" or (
            request.method in _WRITES and b'"resourceVersion"' in body
        )
        if versioned and self.first_write_conflicts and not self.counts["409"]:
            return 409  # the first versioned write always meets a conflict: never untested
        if self.random.random() >= self.rate:
            return None
        return self.random.choice([429, 500, 409] if versioned else [429, 500])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        body = await request.read()
        fault = None if watch else self._fault(request, body)
        if fault is not None:
            reason = {429: "TooManyRequests", 500: "InternalError", 409: "Conflict"}[fault]
            self.counts[str(fault)] += 1
            return web.json_response(
                _status(fault, reason, f"injected by the fault proxy ({fault})"),
                status=fault,
                headers={"Retry-After": "1"} if fault == 429 else None,
            )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP_HEADERS}
        upstream = f"{self.server.server_url}{request.rel_url}"
        async with self._session.request(
            request.method, upstream, headers=headers, data=body or None
        ) as response:
            out_headers = {
                k: v for k, v in response.headers.items() if k.lower() not in _SKIP_HEADERS
            }
            if not watch:
                data = await response.read()
                self.counts["forwarded"] += 1
                self.counts[f"forwarded_{request.method}"] += 1
                return web.Response(status=response.status, body=data, headers=out_headers)
            stream = web.StreamResponse(status=response.status, headers=out_headers)
            await stream.prepare(request)
            self.counts["watch"] += 1
            lifetime = self.random.uniform(*self.drop_watch_after)
            task = asyncio.current_task()
            if task is not None:
                self._watches.add(task)
            try:
                async with asyncio.timeout(lifetime):
                    async for chunk in response.content.iter_any():
                        await stream.write(chunk)
            except (aiohttp.ClientError, ConnectionError):
                return stream  # either side went away (the operator stopped, or we do)
            except TimeoutError:
                self.counts["watch_dropped"] += 1
                if request.transport is not None:
                    request.transport.abort()  # no final chunk: the client sees a broken stream
            finally:
                self._watches.discard(task)  # type: ignore[arg-type]
            return stream

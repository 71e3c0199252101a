"""The workspace agent's aiohttp application served in this process, on a thread of its own,
for tests that reach into the agent (its journal, a fault) while calling it over real HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

from sandbox_core.agent import wire
from sandbox_core.agent.operations import AgentConfig
from sandbox_core.agent.server import Agent

TOKEN = "in-process-test-token"


class InProcessAgent:
    """An :class:`Agent` over ``work`` (state, sandboxes, token), listening on 127.0.0.1."""

    def __init__(self, work: Path, **config: Any) -> None:
        token = work / "token"
        token.write_text(TOKEN)
        self.agent = Agent(
            AgentConfig(
                state_dir=work / "state",
                sandbox_root=work / "sandboxes",
                token_file=token,
                environ={},
                **config,
            )
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    def start(self) -> InProcessAgent:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        self.runner = web.AppRunner(self.agent.app())
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.agent.worker.shutdown(wait=True)

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        request_id: str | None = None,
        content_type: str = wire.JSON_CONTENT_TYPE,
    ) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers, body bytes)`` of one request (refusals included)."""
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": content_type}
        if request_id is not None:
            headers[wire.REQUEST_ID_HEADER] = request_id
        request = urllib.request.Request(  # noqa: S310 - a local test URL
            self.url + path, data=body, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:  # noqa: S310
                return reply.status, dict(reply.headers), reply.read()
        except urllib.error.HTTPError as refused:
            return refused.code, dict(refused.headers), refused.read()

    def json(
        self, method: str, path: str, body: Any = None, *, request_id: str | None = None
    ) -> tuple[int, dict[str, str], Any]:
        data = None if body is None else json.dumps(body).encode()
        status, headers, raw = self.call(method, path, data, request_id=request_id)
        return status, headers, json.loads(raw)

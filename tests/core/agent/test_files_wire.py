"""The wire's table for the actor's file errors: a missing file is 404, a refused path or
operation 422, and each comes back to a remote caller as the core exception a local one sees."""

from __future__ import annotations

import pytest

from sandbox_core.agent import wire
from sandbox_core.errors import (
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileOperationError,
    SandboxPathError,
)


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (SandboxFileNotFoundError("no file 'x'"), wire.NOT_FOUND),
        (SandboxPathError("Path traversal not allowed: '../x'"), wire.UNPROCESSABLE),
        (SandboxFileOperationError("old text occurs 2 times"), wire.UNPROCESSABLE),
    ],
)
def test_actor_file_errors_cross_the_wire_as_themselves(error: SandboxError, status: int) -> None:
    replied_status, body = wire.error_reply(error)
    assert replied_status == status
    again = wire.core_error(wire.error_of(body))
    assert type(again) is type(error) and str(again) == str(error)


def test_every_actor_route_is_in_the_one_table_once() -> None:
    assert set(wire.ACTOR_ROUTES) <= set(wire.ROUTES)
    assert len({(r.method, r.template) for r in wire.ROUTES}) == len(wire.ROUTES)
    assert all(r.changes for r in (wire.FILE_PUT, wire.FILE_EDIT, wire.UPLOAD, wire.SQL))
    assert not any(r.changes for r in (wire.FILE_BYTES, wire.GREP, wire.GLOB, wire.DOWNLOAD))

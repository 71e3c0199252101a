"""Malformed requests get a JSON 400 naming the field, never a 500, a traceback or a host path
(docs/security.md, "Malformed requests").

Hypothesis sends every body-taking route of ``wire.ROUTES`` bytes that are not JSON, JSON that is
not an object, and objects with one field of the wrong type; and every route garbage queries.
Each reply is JSON ``{"error": {"type", "message"}}`` with a status below 500, without the
agent's directories in it; a wrong field is named in the message. Nothing runs: the bodies are
refused before any operation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_core.agent import wire
from tests.core.agent.inprocess import InProcessAgent

SID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"
BODY_ROUTES = sorted(wire.BODY_FIELDS, key=lambda r: (r.template, r.method))
ALL_ROUTES = sorted(
    (r for r in wire.ROUTES if r is not wire.HEALTHZ), key=lambda r: (r.template, r.method)
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessAgent, Path]]:
    work = tmp_path_factory.mktemp("agent")
    data = work / "data"
    data.mkdir()
    (data / "f.txt").write_text("base\n")
    agent = InProcessAgent(work).start()
    body = {
        "plan_id": "p", "resource_id": "r", "strategy": "copy_on_write",
        "original": str(data), "sandbox_id": SID,
    }  # fmt: skip
    assert agent.json("POST", wire.CREATE.path(), body, request_id="create")[0] == 200
    yield agent, work
    agent.stop()


COUNTER = {"n": 0}


def send(agent: InProcessAgent, route: wire.Route, raw: bytes | None, query: str = "") -> Any:
    COUNTER["n"] += 1
    path = route.path(sid=SID, cid="01HZX0A7Q3J0F8K2M4N6P8R0T9", eid="e" * 32) + query
    status, headers, body = agent.call(route.method, path, raw, request_id=f"fuzz-{COUNTER['n']}")
    return status, headers, body


def check_refusal(status: int, headers: dict[str, str], body: bytes, work: Path) -> dict[str, Any]:
    assert status < 500, (status, body)
    assert headers.get("Content-Type", "").startswith(wire.JSON_CONTENT_TYPE), headers
    text = body.decode()
    assert str(work) not in text and "Traceback" not in text, text
    found: dict[str, Any] = json.loads(text)
    return found


@FUZZ
@given(route=st.sampled_from(BODY_ROUTES), raw=st.binary(max_size=64))
def test_bytes_that_are_not_json_are_a_json_400(
    served: tuple[InProcessAgent, Path], route: wire.Route, raw: bytes
) -> None:
    if not raw:
        return  # no body is an empty object, by the contract
    with contextlib.suppress(ValueError):
        json.loads(raw)
        return  # valid JSON: the other properties cover it
    agent, work = served
    reply = check_refusal(*send(agent, route, raw), work)
    assert reply["error"] == {"type": "BadRequest", "message": "the body is not JSON"}


@FUZZ
@given(route=st.sampled_from(BODY_ROUTES), value=JSON_VALUES)
def test_json_that_is_not_an_object_is_a_json_400(
    served: tuple[InProcessAgent, Path], route: wire.Route, value: Any
) -> None:
    if isinstance(value, dict) or value is None:
        return
    agent, work = served
    status, headers, body = send(agent, route, json.dumps(value).encode())
    reply = check_refusal(status, headers, body, work)
    assert status == 400 and reply["error"]["message"] == "the body must be a JSON object"


@st.composite
def wrong_fields(draw: st.DrawFn) -> tuple[wire.Route, str, Any]:
    route = draw(st.sampled_from(BODY_ROUTES))
    name, kinds = draw(st.sampled_from(sorted(wire.BODY_FIELDS[route].items())))
    value = draw(
        JSON_VALUES.filter(
            lambda v: (
                v is not None
                and (not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds))
            )
        )
    )
    return route, name, value


@FUZZ
@given(case=wrong_fields())
def test_a_field_of_the_wrong_type_is_a_json_400_naming_it(
    served: tuple[InProcessAgent, Path], case: tuple[wire.Route, str, Any]
) -> None:
    route, name, value = case
    agent, work = served
    status, headers, body = send(agent, route, json.dumps({name: value}).encode())
    reply = check_refusal(status, headers, body, work)
    assert status == 400, reply
    assert reply["error"]["type"] == "BadRequest"
    assert reply["error"]["message"].startswith(f"{name} must be "), reply


@FUZZ
@given(
    route=st.sampled_from(ALL_ROUTES),
    query=st.dictionaries(
        st.sampled_from(["path", "offset", "length", "after", "limit", "max", "append"]),
        st.text(max_size=8),
        max_size=3,
    ),
)
def test_garbage_queries_never_fail_the_agent(
    served: tuple[InProcessAgent, Path], route: wire.Route, query: dict[str, str]
) -> None:
    if route in (wire.CLEANUP, wire.EXEC, wire.RESTORE) or route.method != "GET":
        return  # only reads: a fuzzed cleanup or command is not this test's business
    agent, work = served
    import urllib.parse

    status, headers, body = send(agent, route, None, "?" + urllib.parse.urlencode(query))
    assert status < 500, body
    if status >= 400:
        check_refusal(status, headers, body, work)


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        (wire.UPLOAD, {"files": [{"path": 3}]}, "files[0].path"),
        (wire.UPLOAD, {"files": ["x"]}, "files[0]"),
        (wire.UPLOAD, {"files": [{"path": "a", "content_b64": "***"}]}, "files[0].content_b64"),
        (wire.FILE_WRITE, {"path": "a", "content": "***", "encoding": "base64"}, "content"),
        (wire.EXEC, {"argv": ["true"], "stdin_b64": "***"}, "stdin_b64"),
    ],
)  # fmt: skip
def test_nested_and_encoded_fields_are_named(
    served: tuple[InProcessAgent, Path], route: wire.Route, body: Any, field: str
) -> None:
    agent, work = served
    status, headers, raw = send(agent, route, json.dumps(body).encode())
    reply = check_refusal(status, headers, raw, work)
    assert status == 400 and reply["error"]["message"].startswith(field), reply


def test_the_http_layers_refusals_are_json_too(served: tuple[InProcessAgent, Path]) -> None:
    agent, work = served
    status, headers, body = agent.call("GET", "/v1/no-such-route")
    assert status == 404
    assert check_refusal(status, headers, body, work)["error"]["type"] == "NotFound"
    status, headers, body = agent.call("PATCH", wire.STATUS.path(sid=SID))
    assert status == 405
    check_refusal(status, headers, body, work)

"""Optional OpenTelemetry traces (sandbox_operator.kube.tracing): off by default, spans with
their attributes and errors, and the W3C traceparent carried to the workspace agent. The spans
are read from the SDK's in-memory exporter (the tracing extra)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sandbox_operator.executors.agent_client import AgentClient
from sandbox_operator.kube import tracing
from sandbox_operator.settings import Settings

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    """One SDK provider for the process (OpenTelemetry allows setting it once)."""
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(sdk)


@pytest.fixture(autouse=True)
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER


def test_the_exporter_is_off_by_default_and_names_are_checked() -> None:
    assert Settings().otel_exporter == "none"
    assert tracing.configure("none") is False
    with pytest.raises(ValueError, match="unknown trace exporter 'zipkin'"):
        tracing.configure("zipkin")


def test_a_span_keeps_its_attributes_and_records_an_error(spans: InMemorySpanExporter) -> None:
    with tracing.span("sandbox.provision", namespace="team-a", name="s1", strategy=None):
        pass
    with pytest.raises(RuntimeError), tracing.span("plancommit.commit", plan="p1"):
        raise RuntimeError("boom")
    first, second = spans.get_finished_spans()
    assert (first.name, dict(first.attributes or {})) == (
        "sandbox.provision",
        {"namespace": "team-a", "name": "s1"},
    )
    assert second.name == "plancommit.commit"
    assert second.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in second.events] == ["exception"]


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append(dict(self.headers))
        body = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_an_agent_call_inside_a_span_carries_its_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = AgentClient(f"http://127.0.0.1:{server.server_address[1]}", "t0ken", 10)
        client.call("GET", "/v1/outside")
        with tracing.span("sandbox.provision"):
            client.call("GET", "/v1/inside")
    finally:
        server.shutdown()
        server.server_close()
    outside, inside = _Recorder.seen[-2:]
    assert "traceparent" not in {k.lower() for k in outside}
    headers = {k.lower(): v for k, v in inside.items()}
    (finished,) = spans.get_finished_spans()
    context = finished.get_span_context()
    assert headers["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    )

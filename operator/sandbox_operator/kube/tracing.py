"""Optional OpenTelemetry traces of the operator; the exporter is off by default.

Spans (through ``opentelemetry-api``, a no-op until a tracer provider is configured):
``sandbox.provision`` (one provision run of a Sandbox), ``plancommit.<action>`` (one run of a
PlanCommit's saga or rollback) and, inside them, every workspace-agent call carries the W3C
``traceparent`` header (:func:`inject`), so a collector can join the agent's work to the run
that asked for it.

:func:`configure` with ``SANDBOX_OPERATOR_OTEL_EXPORTER=otlp`` installs the SDK's tracer
provider with a batching OTLP/HTTP exporter; where it sends is the exporter's own standard
configuration (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ...). The SDK
and exporter are the ``tracing`` extra of the package.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version

from opentelemetry import propagate, trace

TRACER = trace.get_tracer("sandbox_operator")


def configure(exporter: str) -> bool:
    """Install the exporter named by ``exporter`` (``none``: nothing, the default; ``otlp``:
    the SDK's tracer provider with a batching OTLP/HTTP span exporter). True when installed.

    Raises:
        ValueError: an unknown exporter name.
        RuntimeError: ``otlp`` without the ``tracing`` extra installed.
    """
    if exporter == "none":
        return False
    if exporter != "otlp":
        raise ValueError(f"unknown trace exporter {exporter!r}: use none or otlp")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise RuntimeError(
            "trace exporter otlp needs the tracing extra "
            "(opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)"
        ) from exc
    try:
        release = version("sandbox-operator")
    except PackageNotFoundError:
        release = "0+unknown"
    resource = Resource.create({"service.name": "sandbox-operator", "service.version": release})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return True


@contextmanager
def span(name: str, /, **attributes: str | int | None) -> Iterator[None]:
    """A span ``name`` around the block, with the attributes that are not None; an exception
    leaving the block is recorded on it (status ERROR) and raised on."""
    kept = {key: value for key, value in attributes.items() if value is not None}
    with TRACER.start_as_current_span(name, attributes=kept):
        yield


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's context to ``headers`` (``traceparent``; nothing without a span
    or a configured provider)."""
    propagate.inject(headers)

"""Events in namespaces being deleted (issue 11 §2, case 17): never posted, never retried, one
log line per namespace; kopf's own Event handler is filtered the same way."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from sandbox_operator.kube.events import (
    EventRecorder,
    NamespaceGate,
    build_event,
    install_kopf_filter,
    is_terminating_refusal,
)

REFUSAL = json.dumps(
    {
        "kind": "Status",
        "status": "Failure",
        "message": 'events "s1.abc" is forbidden: unable to create new content in namespace ns1 '
        "because it is being terminated",
        "reason": "Forbidden",
        "code": 403,
    }
)


def body(namespace: str = "ns1", deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "s1", "namespace": namespace, "uid": "u1"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": metadata,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Poster:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, namespace: str, event: dict[str, Any]) -> None:
        self.calls.append((namespace, event))


def refusal() -> ApiException:
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = REFUSAL
    return exc


class RefusingPoster(Poster):
    def __call__(self, namespace: str, event: dict[str, Any]) -> None:
        self.calls.append((namespace, event))
        raise refusal()


def test_the_refusal_is_recognised() -> None:
    assert is_terminating_refusal(refusal())
    other = ApiException(status=403, reason="Forbidden")
    other.body = '{"message": "events is forbidden: User cannot create"}'
    assert not is_terminating_refusal(other)


def test_no_post_into_a_terminating_namespace_seen_through_the_namespace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reads: list[str] = []

    def read(name: str) -> dict[str, Any]:
        reads.append(name)
        return {
            "metadata": {"name": name, "deletionTimestamp": "x"},
            "status": {"phase": "Terminating"},
        }

    poster = Poster()
    recorder = EventRecorder(poster, NamespaceGate(read))
    with caplog.at_level(logging.INFO, "sandbox_operator.events"):
        for reason in ("CleanedUp", "CleanupFailed", "CheckpointDeleted"):
            recorder(body(deleting=True), "Normal", reason, "m")
    assert poster.calls == []
    assert recorder.dropped == 3 and recorder.posted == 0
    assert reads == ["ns1"]  # cached
    assert len([r for r in caplog.records if "being terminated" in r.getMessage()]) == 1


def test_a_refused_post_is_swallowed_once_remembered_and_never_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    poster = RefusingPoster()
    recorder = EventRecorder(poster, NamespaceGate(lambda name: {"status": {"phase": "Active"}}))
    with caplog.at_level(logging.INFO, "sandbox_operator.events"):
        for _ in range(9):
            recorder(body(), "Warning", "CommitFailed", "m")  # an object not being deleted
    assert len(poster.calls) == 1  # the refusal is remembered: nothing else is tried
    assert recorder.dropped == 9
    lines = [r for r in caplog.records if "being terminated" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO


def test_active_namespaces_get_one_post_per_event_and_answers_expire() -> None:
    clock = Clock()
    state = {"phase": "Active"}
    poster = Poster()
    gate = NamespaceGate(lambda name: {"status": dict(state)}, ttl_seconds=5, clock=clock)
    recorder = EventRecorder(poster, gate)
    recorder(body(deleting=True), "Normal", "CleanedUp", "x" * 5000)
    assert len(poster.calls) == 1
    namespace, event = poster.calls[0]
    assert namespace == "ns1" and len(event["message"]) == 1000
    assert event["involvedObject"]["uid"] == "u1" and event["type"] == "Normal"
    state["phase"] = "Terminating"
    recorder(body(deleting=True), "Normal", "CleanedUp", "m")  # cached "Active" still trusted
    clock.now = 6
    recorder(body(deleting=True), "Normal", "CleanedUp", "m")  # re-read: terminating
    assert len(poster.calls) == 2


def test_a_namespace_that_cannot_be_read_falls_back_to_the_refusal_path() -> None:
    def read(name: str) -> dict[str, Any]:
        raise ApiException(status=403, reason="Forbidden")

    poster = RefusingPoster()
    recorder = EventRecorder(poster, NamespaceGate(read))
    recorder(body(deleting=True), "Normal", "CleanedUp", "m")
    recorder(body(deleting=True), "Normal", "CleanedUp", "m")
    assert len(poster.calls) == 1 and recorder.dropped == 2


def test_kopf_log_events_are_filtered_for_known_terminating_namespaces() -> None:
    import kopf  # noqa: F401 - installs kopf's K8sPoster on the kopf.objects logger

    gate = NamespaceGate()
    assert install_kopf_filter(gate) >= 1
    handler = next(
        h for h in logging.getLogger("kopf.objects").handlers if type(h).__name__ == "K8sPoster"
    )
    ours = [f for f in handler.filters if type(f).__name__ == "_TerminatingNamespaceFilter"][-1]
    record = logging.LogRecord("kopf.objects", logging.ERROR, "x", 1, "failed", None, None)
    record.k8s_ref = {"namespace": "ns1"}
    assert ours.filter(record)
    gate.remember("ns1")
    assert not ours.filter(record)
    handler.removeFilter(ours)


def test_build_event_is_a_core_v1_event() -> None:
    event = build_event(body(), "Warning", "Reason", "message")
    assert event["metadata"] == {"generateName": "s1.", "namespace": "ns1"}
    assert event["involvedObject"]["kind"] == "Sandbox"
    assert event["source"] == {"component": "sandbox-operator"}


def test_background_posting_keeps_the_order_and_the_terminating_namespace_policy() -> None:
    """The operator posts from one background thread (issue 11, throughput): the handler does
    not wait, the order is kept, and a terminating namespace still gets nothing."""
    terminating = {"ns1": False}
    poster = Poster()
    recorder = EventRecorder(
        poster,
        NamespaceGate(
            lambda name: {"status": {"phase": "Terminating" if terminating[name] else "Active"}},
            ttl_seconds=0,
        ),
        background=True,
    )
    for number in range(20):
        recorder(body(deleting=True), "Normal", "Step", f"m{number}")
    assert recorder.flush(10)
    assert [event["message"] for _, event in poster.calls] == [f"m{n}" for n in range(20)]
    assert recorder.posted == 20
    terminating["ns1"] = True
    recorder(body(deleting=True), "Normal", "CleanedUp", "late")
    assert recorder.flush(10)
    assert len(poster.calls) == 20 and recorder.dropped == 1

"""The operator's diff-base: in the status, blind to the plan-id label, read from earlier
operators' annotation (issue 11, throughput; docs/api-evolution.md).

kopf's diff-base in an annotation cost every handled object a PATCH of its own beside the
``/status`` PATCH (found with a request trace of bench_operator --throughput). It now lives in
``status.lastHandledConfiguration``; an object handled before the move keeps its annotation,
which must still read as handled, or an upgrade would provision every existing Sandbox again.
"""

from __future__ import annotations

import json

import kopf
from sandbox_operator.kube.diffbase import StatusDiffBase

from sandbox_api.models import PLAN_LABEL

LEGACY = "sandbox.cleveragents.io/last-handled-configuration"


def sandbox(
    labels: dict[str, str],
    annotations: dict[str, str] | None = None,
    status: dict[str, str] | None = None,
    phase: str | None = "Active",
) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "sandbox.cleveragents.io/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": "s", "labels": labels, "annotations": annotations or {}},
            "spec": {"planId": "p", "resourceId": "r"},
            "status": {**({"phase": phase} if phase else {}), **(status or {})},
        }
    )


def stored(body: kopf.Body) -> kopf.Patch:
    """The patch kopf sends after a handler: the storage's store() of the built essence."""
    storage = StatusDiffBase()
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    return patch


def test_the_diff_base_goes_to_the_status_only() -> None:
    patch = stored(sandbox({PLAN_LABEL: "p"}))
    assert set(patch) == {"status"}, "no write of the object itself"
    assert json.loads(patch["status"]["lastHandledConfiguration"]) == {
        "spec": {"planId": "p", "resourceId": "r"}
    }
    body = sandbox({PLAN_LABEL: "p"}, status=dict(patch["status"]))
    assert StatusDiffBase().fetch(body=body) == StatusDiffBase().build(body=body)


def test_the_plan_label_is_no_change() -> None:
    before = StatusDiffBase().build(body=sandbox({}))
    after = StatusDiffBase().build(body=sandbox({PLAN_LABEL: "p"}))
    assert before == after == {"spec": {"planId": "p", "resourceId": "r"}}


def test_other_labels_still_count() -> None:
    built = StatusDiffBase().build(body=sandbox({PLAN_LABEL: "p", "team": "a"}))
    assert built["metadata"] == {"labels": {"team": "a"}}
    assert built != StatusDiffBase().build(body=sandbox({"team": "b"}))


def test_an_object_handled_by_an_earlier_operator_reads_as_handled() -> None:
    # The earlier operator's storage: the annotation, the label inside, and kopf's marker.
    earlier = kopf.AnnotationsDiffBaseStorage(
        prefix="sandbox.cleveragents.io", key="last-handled-configuration"
    )
    body = sandbox({PLAN_LABEL: "p", "team": "a"}, {"note": "kept"})
    patch = kopf.Patch()
    earlier.store(body=body, patch=patch, essence=earlier.build(body=body))
    annotations = {"note": "kept", **patch["metadata"]["annotations"]}
    assert LEGACY in annotations
    upgraded = sandbox({PLAN_LABEL: "p", "team": "a"}, annotations)
    found = StatusDiffBase().fetch(body=upgraded)
    assert found is not None
    assert found == StatusDiffBase().build(body=upgraded), "kopf would see a change"
    assert found["metadata"]["annotations"] == {"note": "kept"}


def test_the_status_wins_over_a_stale_annotation() -> None:
    stale = json.dumps({"spec": {"planId": "old"}})
    fresh = json.dumps({"spec": {"planId": "p", "resourceId": "r"}})
    body = sandbox({}, {LEGACY: stale}, {"lastHandledConfiguration": fresh})
    assert StatusDiffBase().fetch(body=body) == {"spec": {"planId": "p", "resourceId": "r"}}


def test_a_new_object_has_no_diff_base() -> None:
    assert StatusDiffBase().fetch(body=sandbox({})) is None


def earlier_operators_annotations(body: kopf.Body) -> dict[str, str]:
    earlier = kopf.AnnotationsDiffBaseStorage(
        prefix="sandbox.cleveragents.io", key="last-handled-configuration"
    )
    patch = kopf.Patch()
    earlier.store(body=body, patch=patch, essence=earlier.build(body=body))
    return dict(patch["metadata"]["annotations"])


def test_an_object_recreated_from_an_export_is_new_whatever_its_annotation_says() -> None:
    # An exported object keeps its annotations; the API server drops a new object's status.
    annotations = earlier_operators_annotations(sandbox({}))
    recreated = sandbox({}, annotations, phase=None)
    assert StatusDiffBase().fetch(body=recreated) is None


def test_the_first_diff_base_in_the_status_removes_the_earlier_annotation() -> None:
    annotations = earlier_operators_annotations(sandbox({}))
    upgraded = sandbox({}, annotations)
    storage = StatusDiffBase()
    patch = kopf.Patch()
    storage.store(body=upgraded, patch=patch, essence=storage.build(body=upgraded))
    assert patch["metadata"]["annotations"] == {LEGACY: None}
    assert "lastHandledConfiguration" in patch["status"]

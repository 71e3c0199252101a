"""What the ``metadata`` event handler adds to an object, and that it is one transformation
kopf sends with its finalizer (issue 11: throughput; §6: the plan-id label)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from sandbox_operator.reconcilers.metadata import KOPF_MARKER, missing_metadata, set_metadata

from sandbox_api.models import PLAN_LABEL


def body(kind: str, plan_id: str = "plan-a", **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "ns", "resourceVersion": "7", **metadata},
        "spec": {"planId": plan_id},
    }


def test_a_new_sandbox_gets_its_plan_label_and_kopfs_marker() -> None:
    assert missing_metadata(body("Sandbox")) == {
        "labels": {PLAN_LABEL: "plan-a"},
        "annotations": {KOPF_MARKER: "yes"},
    }


def test_other_kinds_get_the_marker_only() -> None:
    for kind in ("Checkpoint", "PlanCommit"):
        assert missing_metadata(body(kind)) == {"annotations": {KOPF_MARKER: "yes"}}


def test_nothing_is_missing_once_both_are_there_and_a_wrong_label_is_set_right() -> None:
    done = body("Sandbox", labels={PLAN_LABEL: "plan-a"}, annotations={KOPF_MARKER: "yes"})
    assert missing_metadata(done) == {}
    edited = body("Sandbox", labels={PLAN_LABEL: "other"}, annotations={KOPF_MARKER: "yes"})
    assert missing_metadata(edited) == {"labels": {PLAN_LABEL: "plan-a"}}


def test_a_plan_id_that_cannot_be_a_label_value_gets_no_label() -> None:
    assert missing_metadata(body("Sandbox", plan_id="a" * 64)) == {
        "annotations": {KOPF_MARKER: "yes"}
    }


def test_the_handler_adds_one_transformation_and_no_merge_patch() -> None:
    raw = body("Sandbox", labels={"team": "a"})
    patch = kopf.Patch(body=kopf.Body(raw))
    asyncio.run(set_metadata(body=kopf.Body(raw), patch=patch))
    assert not dict(patch), "a merge patch would be a request of its own"
    ops = patch.as_json_patch(raw)
    assert {(op["op"], op["path"]) for op in ops} == {
        ("add", "/metadata/labels/sandbox.cleveragents.io~1plan-id"),
        ("add", "/metadata/annotations"),
    }
    assert raw["metadata"]["labels"] == {"team": "a"}, "the object itself is not changed"

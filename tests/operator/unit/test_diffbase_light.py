"""The operator's diff-base copies only what it keeps, and keeps what kopf keeps (issue 11).

kopf's own ``build`` deep-copies the whole object (status, managedFields) on every processing
cycle; ``StatusDiffBase`` copies spec, labels and annotations only. The essence must be
the one kopf builds, minus the plan-id label, for every extra field a handler may watch.
"""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from sandbox_operator.kube.diffbase import StatusDiffBase

from sandbox_api.models import PLAN_LABEL

PREFIX = "sandbox.cleveragents.io"
KEY = "last-handled-configuration"


def full_body() -> dict[str, Any]:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": "s",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "42",
            "generation": 3,
            "finalizers": ["sandbox.cleveragents.io/finalizer"],
            "labels": {PLAN_LABEL: "p", "team": "a"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                "workspace.sandbox.cleveragents.io/pod": "uid:Ready",
                f"{PREFIX}/{KEY}": '{"spec":{}}',
                "note": "kept",
            },
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:x": {}}}}],
        },
        "spec": {"planId": "p", "resourceId": "r", "suspend": False, "options": {"a": [1, 2]}},
        "status": {"phase": "Active", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def kopf_essence(body: dict[str, Any], extra: list[Any]) -> Any:
    """What kopf's own storage builds, with the plan-id label taken out as the operator does."""
    plain = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key=KEY)
    essence = plain.build(body=kopf.Body(copy.deepcopy(body)), extra_fields=extra)
    essence["metadata"]["labels"].pop(PLAN_LABEL)
    return essence


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["spec.suspend"],
        [("metadata", "annotations", "workspace.sandbox.cleveragents.io/pod")],
        ["spec.approvedDigest", ("metadata", "labels", "team")],
        ["status.phase"],  # outside the light copy: the whole body is used
        [("metadata", "generation")],
    ],
)
def test_the_light_essence_is_kopfs_essence(extra: list[Any]) -> None:
    storage = StatusDiffBase()
    body = full_body()
    built = storage.build(body=kopf.Body(body), extra_fields=extra)
    assert built == kopf_essence(body, extra)
    assert "status" not in built or extra == ["status.phase"]
    assert body == full_body(), "building the essence must not change the object"


def test_the_essence_is_a_copy() -> None:
    storage = StatusDiffBase()
    body = full_body()
    built = storage.build(body=kopf.Body(body))
    built["spec"]["options"]["a"].append(3)
    built["metadata"]["annotations"]["note"] = "changed"
    assert body == full_body()

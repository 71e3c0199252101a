"""The operator's diff-base ignores the plan-id label the create handler adds (issue 11).

Without this, every new Sandbox came back "changed" once its label landed: one more PATCH and
processing cycle per object (found with a request trace of bench_operator --throughput).
"""

from __future__ import annotations

import json

import kopf
from sandbox_operator.main import PlanLabelBlindDiffBase
from sandbox_operator.models import PLAN_LABEL

KEY = "sandbox.cleveragents.io/last-handled-configuration"


def sandbox(labels: dict[str, str], annotations: dict[str, str] | None = None) -> kopf.Body:
    return kopf.Body(
        {
            "apiVersion": "sandbox.cleveragents.io/v1alpha1",
            "kind": "Sandbox",
            "metadata": {"name": "s", "labels": labels, "annotations": annotations or {}},
            "spec": {"planId": "p", "resourceId": "r"},
            "status": {"phase": "Active"},
        }
    )


def storage() -> PlanLabelBlindDiffBase:
    return PlanLabelBlindDiffBase(
        prefix="sandbox.cleveragents.io", key="last-handled-configuration"
    )


def test_the_label_added_by_the_create_handler_is_no_change() -> None:
    before = storage().build(body=sandbox({}))
    after = storage().build(body=sandbox({PLAN_LABEL: "p"}))
    assert before == after == {"spec": {"planId": "p", "resourceId": "r"}}


def test_other_labels_still_count_and_old_diff_bases_with_the_label_compare_equal() -> None:
    built = storage().build(body=sandbox({PLAN_LABEL: "p", "team": "a"}))
    assert built["metadata"] == {"labels": {"team": "a"}}
    assert built != storage().build(body=sandbox({"team": "b"}))
    # A diff-base stored by an earlier operator, label included.
    stored = {"spec": {"planId": "p", "resourceId": "r"}, "metadata": {"labels": {PLAN_LABEL: "p"}}}
    body = sandbox({PLAN_LABEL: "p"}, {KEY: json.dumps(stored)})
    assert storage().fetch(body=body) == storage().build(body=body)

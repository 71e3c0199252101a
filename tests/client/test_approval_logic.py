"""The client's approval logic without a server (tier 1; docs/approvals.md, "Approving"): the
entry records the identity as authenticated, the append patch keeps every recorded entry and
names the version read, what is refused before anything is written, when ``approve`` stops
waiting, the pending list, and the review page's per-file, escaped, highlighted diff."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_client import _logic
from sandbox_client.errors import RefusedError
from sandbox_client.models import Identity, PlanReview, recorded_decisions
from sandbox_client.review_page import highlight_diff, split_files

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
ALICE = Identity(user="alice", uid="u-1", groups=["team", "system:authenticated"])


def plancommit(
    name: str = "pc-1",
    phase: str = "AwaitingApproval",
    approvals: list[dict[str, Any]] | None = None,
    judged: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    created: str = "2026-01-01T00:00:00Z",
    generation: int = 2,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": "41",
            "generation": generation,
            "creationTimestamp": created,
            "annotations": {"sandbox.cleveragents.io/created-by": "carol"},
        },
        "spec": {"planId": "p", "approval": "Required", "approvals": approvals or []},
        "status": {
            "phase": phase,
            "review": {"digest": DIGEST, "sandboxes": []},
            "approvals": judged or [],
            "approvedBy": ", ".join(
                str(j["user"]) for j in judged or [] if j.get("counted") is True
            ),
            "conditions": conditions or [],
        },
    }


def test_the_entry_is_the_authenticated_identity_and_refuses_bad_input() -> None:
    assert _logic.decision_entry(ALICE, DIGEST, "Approve", "ok") == {
        "digest": DIGEST,
        "decision": "Approve",
        "user": "alice",
        "uid": "u-1",
        "groups": ["team", "system:authenticated"],
        "comment": "ok",
    }
    assert _logic.decision_entry(Identity(user="bob"), DIGEST, "Reject") == {
        "digest": DIGEST,
        "decision": "Reject",
        "user": "bob",
    }
    for digest, decision in (("sha256:abc", "Approve"), (DIGEST, "Maybe")):
        with pytest.raises(RefusedError) as refused:
            _logic.decision_entry(ALICE, digest, decision)
        assert refused.value.reason == "Invalid"


def test_the_patch_appends_to_every_recorded_entry_at_the_version_read() -> None:
    bob = {"digest": DIGEST, "decision": "Approve", "user": "bob"}
    mine = _logic.decision_entry(ALICE, DIGEST, "Approve")
    patch = _logic.decision_patch(plancommit(approvals=[bob]), mine)
    assert patch == {"metadata": {"resourceVersion": "41"}, "spec": {"approvals": [bob, mine]}}


@pytest.mark.parametrize(
    ("obj", "entry", "reason"),
    [
        (plancommit(phase="Committing"), {"digest": DIGEST, "user": "alice"}, "InvalidState"),
        (plancommit(), {"digest": OTHER, "user": "alice"}, "DigestMismatch"),
        (
            plancommit(approvals=[{"digest": DIGEST, "decision": "Reject", "user": "alice"}]),
            {"digest": DIGEST, "user": "alice"},
            "AlreadyDecided",
        ),
    ],
)
def test_nothing_is_written_that_would_stay_wrong(
    obj: dict[str, Any], entry: dict[str, Any], reason: str
) -> None:
    with pytest.raises(RefusedError) as refused:
        _logic.decision_patch(obj, {"decision": "Approve", **entry})
    assert refused.value.reason == reason


def test_approve_stops_waiting_when_judged_and_more_are_needed_or_it_does_not_count() -> None:
    seen = _logic.decision_seen("pc-1", "alice", DIGEST)
    mine = {"digest": DIGEST, "decision": "Approve", "user": "alice"}
    waiting = {"type": "Approved", "status": "False", "reason": "AwaitingApproval"}
    assert seen({"pc-1": plancommit(approvals=[mine])}) is None  # not judged yet
    judged = [{**mine, "counted": True}]
    stale = plancommit(approvals=[mine], judged=judged, conditions=[
        {**waiting, "observedGeneration": 1}
    ])  # fmt: skip
    assert seen({"pc-1": stale}) is None  # the condition is of the spec before the entry
    more = plancommit(approvals=[mine], judged=judged, conditions=[
        {**waiting, "observedGeneration": 2}
    ])  # fmt: skip
    assert seen({"pc-1": more}) is not None
    creator = plancommit(approvals=[mine], judged=[{**mine, "counted": False}])
    assert seen({"pc-1": creator}) is not None
    done = seen({"pc-1": plancommit(phase="Committed")})
    assert done is not None and done.committed


def test_pending_lists_waiting_reviews_oldest_first_with_their_decisions() -> None:
    alice = {"digest": DIGEST, "decision": "Approve", "user": "alice", "comment": "fine"}
    judged = [{**alice, "counted": True, "observedAt": "2026-01-02T00:00:00Z"}]
    newer = plancommit("pc-b", approvals=[alice], judged=judged, created="2026-01-02T00:00:00Z")
    items = [newer, plancommit("pc-a"), plancommit("pc-c", phase="Committed")]
    found = _logic.pending_reviews(items)
    assert [r.plancommit for r in found] == ["pc-a", "pc-b"]
    assert _logic.pending_reviews(items, "another-plan") == []
    review = found[1]
    assert (review.created_by, review.approved_by) == ("carol", ["alice"])
    [decision] = review.approvals
    assert (decision.user, decision.counted, decision.comment, decision.observed_at) == (
        "alice",
        True,
        "fine",
        "2026-01-02T00:00:00Z",
    )
    unjudged = recorded_decisions(plancommit(approvals=[alice]))
    assert [d.counted for d in unjudged] == [None]
    assert PlanReview.from_object(plancommit()) is not None


def test_the_diff_is_split_per_file_and_escaped_when_highlighted() -> None:
    diff = (
        "diff --git a/g.txt b/g.txt\n--- a/g.txt\n+++ b/g.txt\n@@ -1 +1 @@\n-d0\n+d1\n"
        "diff --git a/<b>.txt b/<b>.txt\nnew file mode 100644\n--- /dev/null\n+++ b/<b>.txt\n"
        "@@ -0,0 +1 @@\n+<script>alert(1)</script>\n"
    )
    files = split_files(diff)
    assert [name for name, _ in files] == ["g.txt", "<b>.txt"]
    assert files[0][1].endswith("+d1\n") and files[1][1].startswith("diff --git a/<b>.txt")
    shown = highlight_diff(files[1][1])
    assert "<script>" not in shown and "&lt;script&gt;" in shown
    assert 'class="gi"' in shown  # the added line, highlighted
    assert split_files("") == [] and split_files("+x\n") == [("", "+x\n")]

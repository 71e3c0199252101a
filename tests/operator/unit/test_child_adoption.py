"""A 409 on create is "made by an earlier attempt" only when the Sandbox controls the object.

The race the real-API-server tests cannot time: the name is free when the operator looks, and
taken when it creates (a 409). The fault is injected at the two API edges of
``sandbox_operator.kube.ownership`` (the read and the create); the pod executor's logic runs
unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sandbox_operator.errors import ChildNameTaken, classify
from sandbox_operator.executors import pod as pod_module
from sandbox_operator.executors.pod import PodExecutor
from sandbox_operator.executors.pod_manifests import build_token_secret
from sandbox_operator.settings import Settings

from sandbox_api.models import MANAGED_BY, MANAGED_BY_LABEL
from sandbox_api.naming import child_object_name

UID = "11111111-2222-3333-4444-555555555555"
OWNER = {"apiVersion": "sandbox.cleveragents.io/v1alpha1", "kind": "Sandbox",
         "metadata": {"name": "s1", "namespace": "ns", "uid": UID}}  # fmt: skip


def target() -> Any:
    return SimpleNamespace(name="s1", namespace="ns", uid=UID, plan_id="p")


def metadata(controller_uid: str, labels: bool = True) -> dict[str, Any]:
    return {
        "name": child_object_name("s1", "agent"),
        "namespace": "ns",
        "uid": "child-uid",
        "labels": {MANAGED_BY_LABEL: MANAGED_BY} if labels else {},
        "ownerReferences": [{"uid": controller_uid, "controller": True, "kind": "Sandbox"}],
    }


@pytest.fixture
def raced(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Reads find nothing until a create was sent; the create answers 409."""
    state: dict[str, Any] = {"created": [], "after": None}

    def read_metadata(api: Any, kind: str, namespace: str, name: str) -> dict | None:
        return state["after"] if state["created"] else None

    def create(api: Any, manifest: dict[str, Any]) -> bool:
        state["created"].append(manifest)
        return False

    monkeypatch.setattr(pod_module, "read_metadata", read_metadata)
    monkeypatch.setattr(pod_module, "create", create)
    return state


@pytest.mark.parametrize(
    "holder",
    [
        metadata("another-sandbox-uid"),
        metadata(UID, labels=False),
        {"name": "x", "namespace": "ns"},
    ],
)
def test_a_name_taken_in_between_is_not_adopted(raced: dict[str, Any], holder: dict) -> None:
    raced["after"] = holder
    executor = PodExecutor(Settings(executor="pod"), api=None)  # type: ignore[arg-type]
    with pytest.raises(ChildNameTaken, match="name taken by another object") as caught:
        executor._ensure(build_token_secret(target(), "t"), OWNER, target())
    assert classify(caught.value).reason == "ChildNameTaken"
    assert classify(caught.value).retryable
    # It was sent with this Sandbox as controller; nothing else was attempted.
    [sent] = raced["created"]
    assert sent["metadata"]["ownerReferences"][0]["uid"] == UID


def test_an_earlier_attempts_object_is_used(raced: dict[str, Any]) -> None:
    raced["after"] = metadata(UID)
    executor = PodExecutor(Settings(executor="pod"), api=None)  # type: ignore[arg-type]
    name = executor._ensure(build_token_secret(target(), "t"), OWNER, target())
    assert name == child_object_name("s1", "agent")


def test_a_sandbox_made_again_under_the_same_name_is_not_the_owner(raced: dict) -> None:
    executor = PodExecutor(Settings(executor="pod"), api=None)  # type: ignore[arg-type]
    other = {**OWNER, "metadata": {**OWNER["metadata"], "uid": "a-newer-uid"}}
    with pytest.raises(ChildNameTaken, match="no longer uid"):
        executor.ensure_children(target(), other)
    assert raced["created"] == []


def test_a_token_secret_the_chart_forbids_reading_is_created_without_a_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The chart grants no `get` on Secrets: every read of the token Secret is a 403. The
    # Secret is still made (and a 409 taken as its name), and nothing but Secrets is excused.
    from kubernetes.client.exceptions import ApiException

    created: list[dict[str, Any]] = []

    def forbidden(api: Any, kind: str, namespace: str, name: str) -> dict | None:
        raise ApiException(status=403, reason="Forbidden")

    def create(api: Any, manifest: dict[str, Any]) -> bool:
        created.append(manifest)
        return len(created) == 1

    monkeypatch.setattr(pod_module, "read_metadata", forbidden)
    monkeypatch.setattr(pod_module, "create", create)
    executor = PodExecutor(Settings(executor="pod"), api=None)  # type: ignore[arg-type]
    name = child_object_name("s1", "agent")
    assert executor._ensure(build_token_secret(target(), "t"), OWNER, target()) == name
    assert executor._ensure(build_token_secret(target(), "t"), OWNER, target()) == name
    assert [m["metadata"]["ownerReferences"][0]["uid"] for m in created] == [UID, UID]
    with pytest.raises(ApiException):
        executor.owned_child("Pod", target())

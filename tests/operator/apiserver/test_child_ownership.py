"""A Sandbox's children are its own: by name, by owner, and whatever its status says (tier 2).

A security review found, on the real API server: child names were the Sandbox's name cut and
with ``.`` folded into ``-``, so ``team.x`` and ``team-x`` (or two names sharing their first 51
characters) shared one Pod, Secret and scratch claim, and deleting one Sandbox deleted the
other's; a 409 on create was taken as "made by me" (a Secret planted under the token's name
was mounted as the agent's token); deletes went by name; and ``status.sandboxId`` /
``status.workspacePod`` / ``status.coreRecord`` were read back as input, so whoever may patch
the status could point the operator at another object.

Real parts: the API server, the operator (pod executor) as a subprocess, the workspace agent
process started the way the kubelet would (``tests.support.kubelet``), SQLite. Tier 2 has no
garbage collector and no volume controller: what the operator deletes itself is all that goes
(a claim stays ``Terminating`` under its protection finalizer).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from sandbox_api.models import MANAGED_BY, MANAGED_BY_LABEL
from sandbox_api.naming import child_object_name, legacy_child_object_name
from tests.support.kubelet import POD, SECRET, Kubelet
from tests.support.operator import Cluster, OperatorProcess, db_sandbox, wait_for

pytestmark = pytest.mark.slow

CHILDREN = (
    ("pod", "ws"),
    ("secret", "agent"),
    ("persistentvolumeclaim", "scratch"),
    ("networkpolicy", "ws"),
)


def controller(obj: dict[str, Any]) -> str:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((str(r["uid"]) for r in refs if r.get("controller")), "")


def present(obj: dict[str, Any] | None) -> bool:
    """The object exists and is not being deleted."""
    return obj is not None and not obj["metadata"].get("deletionTimestamp")


def uid_of(cluster: Cluster, kind: str, name: str) -> str:
    found = cluster.get(kind, name)
    assert found is not None, f"{kind}/{name}"
    return str(found["metadata"]["uid"])


def request_rollback(cluster: Cluster, name: str, request: str) -> dict[str, Any]:
    patch = json.dumps({"spec": {"rollbackRequest": {"id": request}}})
    cluster.kubectl("patch", "sandbox", name, "--type=merge", "-p", patch)
    wait_for(
        lambda: cluster.status("sandbox", name).get("lastRollbackRequestId") == request,
        60,
        f"rollback request {request} served",
    )
    served = cluster.condition("sandbox", name, "RollbackRequested")
    assert served is not None and served["status"] == "True", served
    return cluster.status("sandbox", name)


def active(cluster: Cluster, kubelet: Kubelet) -> dict[str, Any]:
    wait_for(lambda: cluster.get("pod", kubelet.pod), 60, "the workspace Pod")
    kubelet.start_container()
    kubelet.report_ready()
    status = cluster.wait_phase("sandbox", "s-db", {"Active", "Errored"}, timeout=60)
    assert status["phase"] == "Active", status
    return status


def test_a_name_held_by_another_object_is_neither_adopted_nor_deleted(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet]
) -> None:
    # Planted under the token Secret's name, with the operator's own label: a token its
    # author knows. Only the controller ownerReference makes an object the Sandbox's.
    planted = base64.b64encode(b"known-to-the-planter").decode()
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "data": {"token": planted},
        }
    )
    before = cluster.get("secret", SECRET)
    assert before is not None
    cluster.create(db_sandbox("s-db", "plan-t", "db"))
    degraded = wait_for(
        lambda: (
            found
            if (found := cluster.condition("sandbox", "s-db", "Degraded"))
            and found.get("reason") == "ChildNameTaken"
            else None
        ),
        60,
        "Degraded=True ChildNameTaken",
    )
    assert degraded["status"] == "True"
    assert "name taken by another object" in degraded["message"]
    assert f"Secret {cluster.namespace}/{SECRET}" in degraded["message"]
    warnings = [e for e in cluster.events("s-db") if e["type"] == "Warning"]
    assert any("ChildNameTaken" in e["message"] for e in warnings), warnings
    # Not adopted, not mounted: no Pod was made with it.
    assert cluster.get("pod", POD) is None
    after = cluster.get("secret", SECRET)
    assert after is not None and not after["metadata"].get("ownerReferences")
    assert after["data"] == {"token": planted}
    # Deleting the Sandbox deletes what it controls only.
    cluster.kubectl("delete", "sandbox", "s-db", "--timeout=60s")
    assert cluster.get("sandbox", "s-db") is None
    kept = cluster.get("secret", SECRET)
    assert kept is not None and kept["metadata"]["uid"] == before["metadata"]["uid"]


def test_sandboxes_whose_names_the_old_scheme_merged_get_children_of_their_own(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet]
) -> None:
    long = "p-" + "a" * 50
    names = ["team.x", "team-x", f"{long}-repo", f"{long}-docs"]
    for name in names:
        cluster.create(db_sandbox(name, "plan-n", "db"))
    for name in names:
        wait_for(lambda n=name: cluster.get("pod", child_object_name(n, "ws")), 60, f"{name} Pod")
    owners = {name: uid_of(cluster, "sandbox", name) for name in names}
    children: dict[tuple[str, str], str] = {}
    for name in names:
        for kind, suffix in CHILDREN:
            child = cluster.get(kind, child_object_name(name, suffix))
            assert child is not None, (name, kind)
            assert controller(child) == owners[name], (name, kind)
            children[(name, kind)] = str(child["metadata"]["uid"])
    assert len(set(children.values())) == len(names) * len(CHILDREN)
    pod = cluster.get("pod", child_object_name("team.x", "ws"))
    assert pod is not None
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["agent-token"]["secret"]["secretName"] == child_object_name("team.x", "agent")
    assert volumes["scratch"]["persistentVolumeClaim"]["claimName"] == child_object_name(
        "team.x", "scratch"
    )

    # Deleting one of each pair leaves the other's children exactly as they were.
    for gone in ("team.x", f"{long}-repo"):
        cluster.kubectl("delete", "sandbox", gone, "--timeout=60s")
        assert cluster.get("pod", child_object_name(gone, "ws")) is None
        assert not present(cluster.get("persistentvolumeclaim", child_object_name(gone, "scratch")))
    for kept in ("team-x", f"{long}-docs"):
        for kind, suffix in CHILDREN:
            child = cluster.get(kind, child_object_name(kept, suffix))
            assert present(child), (kept, kind)
            assert child is not None and child["metadata"]["uid"] == children[(kept, kind)]


def test_a_patched_status_points_the_operator_at_nothing(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet]
) -> None:
    _, kubelet = pod_operator
    # Objects that are not the Sandbox's, which a status patch names.
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "victim", "labels": {"app.kubernetes.io/component": "other"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "victim-token"},
            "data": {"token": base64.b64encode(b"x").decode()},
        }
    )
    victims = {
        ("pod", "victim"): uid_of(cluster, "pod", "victim"),
        ("secret", "victim-token"): uid_of(cluster, "secret", "victim-token"),
    }
    cluster.create(db_sandbox("s-db", "plan-s", "db"))
    status = active(cluster, kubelet)
    sandbox_id = status["sandboxId"]
    foreign_id = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
    forged = {
        "status": {
            "sandboxId": foreign_id,
            "workspacePod": "victim",
            "coreRecord": {
                **status["coreRecord"],
                "sandbox_id": foreign_id,
                "context": {
                    **(status["coreRecord"].get("context") or {}),
                    "sandbox_id": foreign_id,
                    "sandbox_path": "/workspace/scratch/sandboxes/txn/" + foreign_id,
                },
            },
        }
    }
    cluster.kubectl(
        "patch", "sandbox", "s-db", "--subresource=status", "--type=merge", "-p", json.dumps(forged)
    )
    assert cluster.status("sandbox", "s-db")["workspacePod"] == "victim"

    # The agent of the Sandbox's own Pod serves the request, for the Sandbox's own id.
    served = request_rollback(cluster, "s-db", "r1")
    assert served["sandboxId"] == sandbox_id
    assert served["workspacePod"] == POD
    assert served["coreRecord"]["sandbox_id"] == sandbox_id

    cluster.kubectl(
        "patch", "sandbox", "s-db", "--subresource=status", "--type=merge", "-p", json.dumps(forged)
    )
    cluster.kubectl("delete", "sandbox", "s-db", "--timeout=60s")
    assert cluster.get("pod", POD) is None
    for (kind, name), uid in victims.items():
        found = cluster.get(kind, name)
        assert present(found) and found is not None and found["metadata"]["uid"] == uid


class SameVolume(Kubelet):
    """The kubelet of a Pod whose scratch claim is the remade old one: the same volume (the
    directory the first Pod's claim had), mounted at the same path as before."""

    def scratch_dir(self, pod: dict[str, Any]) -> Path:
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "scratch")
        assert volume["persistentVolumeClaim"]["claimName"] == legacy_child_object_name(
            "s-db", "scratch"
        )
        return self.work / "claims" / child_object_name("s-db", "scratch")


def test_a_sandbox_made_before_hashed_names_keeps_its_children(
    cluster: Cluster, pod_operator: tuple[OperatorProcess, Kubelet], tmp_path: Path
) -> None:
    operator, kubelet = pod_operator
    cluster.create(db_sandbox("s-db", "plan-u", "db"))
    active(cluster, kubelet)
    operator.stop()
    kubelet.stop()

    # What an operator before hashed names left: the same children under the old names,
    # controlled by the Sandbox, the Pod mounting the old claim and Secret; its status names
    # the old Pod. (Remade here from the new ones; the old claim is the same volume.)
    legacy = {suffix: legacy_child_object_name("s-db", suffix) for _, suffix in CHILDREN}
    for kind, suffix in CHILDREN:
        current = child_object_name("s-db", suffix)
        obj = cluster.get(kind, current)
        assert obj is not None
        metadata = {
            k: obj["metadata"][k] for k in ("labels", "ownerReferences") if k in obj["metadata"]
        }
        manifest = {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "metadata": {**metadata, "name": legacy[suffix]},
            **{k: obj[k] for k in ("spec", "data", "type") if k in obj},
        }
        if kind == "pod":
            for volume in manifest["spec"]["volumes"]:
                if "persistentVolumeClaim" in volume:
                    volume["persistentVolumeClaim"]["claimName"] = legacy["scratch"]
                if "secret" in volume:
                    volume["secret"]["secretName"] = legacy["agent"]
        cluster.kubectl("delete", kind, current, "--wait=false")
        if kind == "persistentvolumeclaim":
            cluster.kubectl(
                "patch", kind, current, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
            )
        wait_for(lambda k=kind, c=current: cluster.get(k, c) is None, 30, f"{kind} {current} gone")
        cluster.create(manifest)
    old_status = json.dumps({"status": {"workspacePod": legacy["ws"]}})
    cluster.kubectl(
        "patch", "sandbox", "s-db", "--subresource=status", "--type=merge", "-p", old_status
    )

    # The new operator finds them by owner and keeps using them.
    old = SameVolume(cluster, tmp_path, kubelet.port, kubelet.dsn, legacy["ws"], legacy["agent"])
    renewed = SameVolume(cluster, tmp_path, kubelet.port, kubelet.dsn, POD, legacy["agent"])
    try:
        operator.start()
        old.start_container()
        old.report_ready()
        served = request_rollback(cluster, "s-db", "r1")
        assert served["workspacePod"] == legacy["ws"]
        for kind, suffix in CHILDREN:
            assert cluster.get(kind, child_object_name("s-db", suffix)) is None, kind

        # A Pod made again takes the new name and mounts the old claim and Secret: the
        # sandbox's state on the claim continues.
        cluster.kubectl("delete", "pod", legacy["ws"], "--wait=true")
        old.stop()
        pod = wait_for(lambda: cluster.get("pod", POD), 60, "the Pod made again")
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["scratch"]["persistentVolumeClaim"]["claimName"] == legacy["scratch"]
        assert volumes["agent-token"]["secret"]["secretName"] == legacy["agent"]
        renewed.start_container()
        renewed.report_ready()
        served = request_rollback(cluster, "s-db", "r2")
        assert served["workspacePod"] == POD
        assert cluster.get("secret", child_object_name("s-db", "agent")) is None
        assert cluster.get("persistentvolumeclaim", child_object_name("s-db", "scratch")) is None

        # Deleting the Sandbox deletes its children under both names; the token Secret is left
        # to garbage collection (the operator may delete no Secret): it is the Sandbox's.
        sandbox_uid = uid_of(cluster, "sandbox", "s-db")
        cluster.kubectl("delete", "sandbox", "s-db", "--timeout=60s")
        assert cluster.get("pod", POD) is None
        token = cluster.get("secret", legacy["agent"])
        assert token is not None
        assert [ref["uid"] for ref in token["metadata"]["ownerReferences"]] == [sandbox_uid]
        assert cluster.get("networkpolicy", legacy["ws"]) is None
        assert not present(cluster.get("persistentvolumeclaim", legacy["scratch"]))
    finally:
        old.stop()
        renewed.stop()

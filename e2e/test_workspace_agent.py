"""The workspace agent on a real cluster (tier 3): the agent instead of exec, no secrets in sight,
workspace Pods that are watched, shaped and suspended.

- agent calls with the Sandbox's token succeed; without a token or with a wrong one they are
  refused (401), even from the operator's Pod (other Pods cannot connect at all:
  e2e/test_network_policy.py);
- a deleted workspace Pod is made again and the sandbox re-opened from its scratch claim, with
  its changes; Ready follows the Pod in between;
- suspend deletes the Pod and keeps the claim; resume brings every change back;
- a namespace with a ResourceQuota admits a Sandbox whose ``spec.workspace.resources`` are set;
- a DSN with a known password appears in no status, Event, operator log line or process
  argument of any Pod, and the workspace Pod reads it through ``secretKeyRef``;
- ``kubectl auth can-i`` as the operator's ServiceAccount: no ``pods/exec``, no reading Secrets.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from typing import Any

from e2e.conftest import RELEASE, Originals, Release, active, sandbox_manifest, write_in_sandbox
from e2e.kube import Kube, wait_until

AGENT_PORT = 8471
CALL = (
    "import sys, urllib.request, urllib.error\n"
    "url, token = sys.argv[1], sys.argv[2]\n"
    "req = urllib.request.Request(url)\n"
    "if token != '-':\n"
    "    req.add_header('Authorization', 'Bearer ' + token)\n"
    "try:\n"
    "    with urllib.request.urlopen(req, timeout=10) as r:\n"
    "        print(r.status, r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code, e.read().decode())\n"
)


def agent_token(kube: Kube, namespace: str, sandbox: str) -> str:
    """The Sandbox's token as its workspace Pod holds it: the Secret the Pod mounts (tokens
    expire and are renewed, so the Secret, not a derivation, says which one is current)."""
    status = kube.json("get", "sandbox", sandbox, "-n", namespace)["status"]
    pod = kube.json("get", "pod", status["workspacePod"], "-n", namespace)
    [secret_name] = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
    secret = kube.json("get", "secret", secret_name, "-n", namespace)
    return base64.b64decode(secret["data"]["token"]).decode()


def derived_token(kube: Kube, release: Release, sandbox_uid: str) -> str:
    """A token derived from the release's agent key for ``sandbox_uid`` (the form of tokens
    made before they expired): for a uid that is not the Sandbox's, a token it must refuse."""
    secret = kube.json(
        "get", "secret", f"{RELEASE}-sandbox-operator-agent-key", "-n", release.namespace
    )
    key = base64.b64decode(secret["data"]["key"]).strip()
    return hmac.new(key, sandbox_uid.encode(), hashlib.sha256).hexdigest()


def call_from(kube: Kube, namespace: str, pod: str, url: str, token: str) -> tuple[int, str]:
    """``GET url`` from inside ``pod`` (python3 of the project image); (status, body)."""
    out = kube.kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", CALL, url, token)
    code, _, body = out.strip().partition(" ")
    return int(code), body


def pod_of(kube: Kube, namespace: str, status: dict[str, Any]) -> dict[str, Any]:
    return dict(kube.json("get", "pod", status["workspacePod"], "-n", namespace))


def test_agent_calls_need_the_sandboxs_token(
    kube: Kube, namespace: str, originals: Originals, operator_release: Release
) -> None:
    kube.apply(namespace, sandbox_manifest("s-git", "plan-a", "git_worktree", "repos/app"))
    status = active(kube, namespace, "s-git")
    pod = pod_of(kube, namespace, status)
    url = f"http://{pod['status']['podIP']}:{AGENT_PORT}/v1/sandboxes/{status['sandboxId']}"
    token = agent_token(kube, namespace, "s-git")
    # No token, a wrong one, another Sandbox's: refused, even from the operator's Pod (the only
    # one the NetworkPolicy lets connect: e2e/test_network_policy.py).
    operator_pod = operator_release.pod_names(kube)[0]
    ns = operator_release.namespace
    assert call_from(kube, ns, operator_pod, url, "-")[0] == 401
    assert call_from(kube, ns, operator_pod, url, "0" * 64)[0] == 401
    other = derived_token(kube, operator_release, str(uuid.uuid4()))
    assert call_from(kube, ns, operator_pod, url, other)[0] == 401
    # The operator's own call with the right token is served.
    code, body = call_from(kube, operator_release.namespace, operator_pod, url, token)
    assert code == 200, body
    assert json.loads(body)["status"] == "active"
    # The workspace Pod runs the agent as its main process, and the token is a mounted file.
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["sandbox-core", "serve-workspace"]
    assert all("TOKEN" not in e["name"] or "FILE" in e["name"] for e in container["env"])
    owners = pod["metadata"]["ownerReferences"]
    assert owners[0]["kind"] == "Sandbox" and owners[0]["name"] == "s-git"
    assert pod["spec"]["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"


def test_a_deleted_workspace_pod_is_made_again_with_the_changes(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    kube.apply(namespace, sandbox_manifest("s-git", "plan-d", "git_worktree", "repos/app"))
    status = active(kube, namespace, "s-git")
    write_in_sandbox(kube, namespace, status, "f.txt", "kept\n")
    old_uid = pod_of(kube, namespace, status)["metadata"]["uid"]
    kube.kubectl("delete", "pod", status["workspacePod"], "-n", namespace, "--wait=true")

    def new_pod_ready() -> dict[str, Any] | None:
        found = kube.json(
            "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=workspace"
        )
        for item in found.get("items") or []:
            conditions = {c["type"]: c["status"] for c in item["status"].get("conditions") or []}
            if item["metadata"]["uid"] != old_uid and conditions.get("Ready") == "True":
                return dict(item)
        return None

    wait_until("a new workspace Pod, Ready", new_pod_ready, 180)
    wait_until(
        "Ready=True again",
        lambda: kube.condition("sandbox", namespace, "s-git", "Ready").get("status") == "True",
        120,
    )
    again = active(kube, namespace, "s-git")
    assert again["sandboxId"] == status["sandboxId"]
    content = kube.exec(
        namespace, again["workspacePod"], f"cat {again['sandboxPath']}/f.txt", container="workspace"
    )
    assert content == "kept\n"
    reasons = [
        e["reason"]
        for e in kube.json("get", "events", "-n", namespace)["items"]
        if e["involvedObject"]["name"] == "s-git"
    ]
    assert "WorkspacePodRecreated" in reasons
    warnings = [
        e
        for e in kube.json("get", "events", "-n", namespace)["items"]
        if e["involvedObject"]["name"] == "s-git" and e["type"] == "Warning"
    ]
    assert warnings == [], warnings  # a normal Pending start is no Warning


def test_suspend_deletes_the_pod_keeps_the_claim_and_resume_keeps_every_change(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    kube.apply(namespace, sandbox_manifest("s-copy", "plan-s", "copy_on_write", "data"))
    status = active(kube, namespace, "s-copy")
    write_in_sandbox(kube, namespace, status, "g.txt", "suspended-change\n")
    patch = '{"spec":{"suspend":true}}'
    kube.kubectl("patch", "sandbox", "s-copy", "-n", namespace, "--type=merge", "-p", patch)
    kube.wait_phase("sandbox", namespace, "s-copy", {"Suspended"}, timeout=120)
    wait_until(
        "the workspace Pod gone",
        lambda: (
            kube.kubectl("get", "pod", status["workspacePod"], "-n", namespace, check=False) == ""
        ),
        120,
    )
    claims = kube.json("get", "pvc", "-n", namespace)["items"]
    assert any(c["metadata"]["name"].endswith("-scratch") for c in claims)
    patch = '{"spec":{"suspend":false}}'
    kube.kubectl("patch", "sandbox", "s-copy", "-n", namespace, "--type=merge", "-p", patch)
    resumed = active(kube, namespace, "s-copy")
    content = kube.exec(
        namespace,
        resumed["workspacePod"],
        f"cat {resumed['sandboxPath']}/g.txt",
        container="workspace",
    )
    assert content == "suspended-change\n"
    assert originals.read("data/g.txt") == "d0\n"


def test_workspace_resources_fit_a_namespace_with_a_resource_quota(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "compute"},
        "spec": {
            "hard": {
                "requests.cpu": "2",
                "requests.memory": "2Gi",
                "limits.cpu": "4",
                "limits.memory": "4Gi",
            }
        },
    }
    kube.apply(namespace, quota)
    manifest = sandbox_manifest("s-quota", "plan-q", "git_worktree", "repos/app")
    manifest["spec"]["workspace"] = {
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    }
    kube.apply(namespace, manifest)
    status = active(kube, namespace, "s-quota")
    container = pod_of(kube, namespace, status)["spec"]["containers"][0]
    assert container["resources"]["requests"]["memory"] == "128Mi"


def test_no_password_in_sight_and_the_operator_cannot_exec_or_read_secrets(
    kube: Kube, namespace: str, originals: Originals, operator_release: Release
) -> None:
    password = f"pw-{uuid.uuid4().hex}"
    dsn = f"postgresql://app:{password}@127.0.0.1:1/db?connect_timeout=2"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db"},
        "stringData": {"dsn": dsn},
    }
    sandbox = {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": "s-db"},
        "spec": {
            "planId": "plan-db",
            "resourceId": "db",
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": "db"}},
        },
    }
    kube.apply(namespace, secret, sandbox)
    kube.apply(namespace, sandbox_manifest("s-git", "plan-db", "git_worktree", "repos/app"))
    active(kube, namespace, "s-git")
    status = kube.wait_phase("sandbox", namespace, "s-db", {"Errored", "Active"}, timeout=240)
    assert status["phase"] == "Errored", status  # nothing listens on 127.0.0.1:1
    pod = pod_of(kube, namespace, status) if status.get("workspacePod") else None
    if pod is not None:
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["SANDBOX_SOURCE_DSN"]["valueFrom"]["secretKeyRef"]["name"] == "db"
    visible = [
        kube.kubectl("get", "sandboxes,plancommits,checkpoints", "-n", namespace, "-o", "json"),
        kube.kubectl("get", "events", "-n", namespace, "-o", "json"),
    ]
    for operator_pod in operator_release.pod_names(kube):
        visible.append(kube.kubectl("logs", "-n", operator_release.namespace, operator_pod))
    workspace_pods = kube.json(
        "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=workspace"
    )["items"]
    assert workspace_pods
    for item in workspace_pods:
        if item["status"].get("phase") != "Running":
            continue
        visible.append(
            kube.exec(
                namespace,
                item["metadata"]["name"],
                "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done",
                container="workspace",
            )
        )
    everything = "\n".join(visible)
    assert "serve-workspace" in everything  # the process arguments were read
    assert password not in everything
    # RBAC evaluated by the real API server for the operator's ServiceAccount.
    subject = f"system:serviceaccount:{operator_release.namespace}:{RELEASE}-sandbox-operator"
    for args, expected in (
        (("create", "pods", "--subresource=exec"), "no"),
        (("get", "secrets"), "no"),
        (("list", "secrets"), "no"),
        (("watch", "secrets"), "no"),
        (("create", "pods"), "yes"),
    ):
        answer = kube.kubectl(
            "auth", "can-i", *args, "--as", subject, "-n", namespace, check=False
        ).strip()
        assert answer == expected, (args, answer)

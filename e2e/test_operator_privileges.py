"""The installed chart's privileges, asked of the real cluster as the operator's ServiceAccount
(tier 3; tests/operator/apiserver/test_operator_privileges.py asks the same on tier 2):

- RBAC (``kubectl auth can-i --as``): no Secret read, listed, watched, updated or deleted, in a
  Sandbox namespace or cluster-wide; only the agent key read, by name, in the operator's own
  namespace; ``patch`` on Secrets (the token renewal) and ``create`` on Pods, but no
  ``pods/exec``;
- admission (the chart's ValidatingAdmissionPolicy, server-side dry runs as the operator): a
  Pod that is not a workspace Pod is refused, a Pod it did not make may not be deleted, a Secret
  that is not an agent-token Secret may not be changed; the administrator is not bound by it.
"""

from __future__ import annotations

import json
from typing import Any

from e2e.conftest import RELEASE, Release
from e2e.kube import Kube


def _subject(release: Release) -> str:
    return f"system:serviceaccount:{release.namespace}:{RELEASE}-sandbox-operator"


def _can(kube: Kube, subject: str, *args: str) -> str:
    return kube.kubectl("auth", "can-i", *args, "--as", subject, check=False).strip()


def _as(kube: Kube, subject: str | None, *args: str, stdin: str | None = None) -> Any:
    who = ["--as", subject] if subject else []
    return kube.run([kube.kubectl_path, *args, *who], stdin=stdin, check=False)


def _bare_pod(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"]}]},
    }  # fmt: skip


def test_the_operator_service_account_is_bounded_by_rbac_and_admission(
    kube: Kube, operator_release: Release, namespace: str
) -> None:
    subject = _subject(operator_release)
    # RBAC: Secrets.
    for verb in ("get", "list", "watch", "update", "delete", "deletecollection"):
        assert _can(kube, subject, verb, "secrets", "-n", namespace) == "no", verb
        assert _can(kube, subject, verb, "secrets", "--all-namespaces") == "no", verb
    assert _can(kube, subject, "patch", "secrets", "-n", namespace) == "yes"
    key = f"secrets/{RELEASE}-sandbox-operator-agent-key"
    assert _can(kube, subject, "get", key, "-n", operator_release.namespace) == "yes"
    assert _can(kube, subject, "get", "secrets/other", "-n", operator_release.namespace) == "no"
    # RBAC: Pods, but no exec into them.
    assert _can(kube, subject, "create", "pods", "-n", namespace) == "yes"
    assert _can(kube, subject, "create", "pods", "--subresource=exec", "-n", namespace) == "no"

    # Admission: a Pod of any other shape is refused to the operator, not to the administrator.
    pod = json.dumps(_bare_pod(namespace, "not-a-workspace"))
    dry_create = ["create", "--dry-run=server", "-o", "name", "-f", "-"]
    refused = _as(kube, subject, *dry_create, stdin=pod)
    assert refused.returncode != 0 and "ValidatingAdmissionPolicy" in refused.stderr, refused
    assert _as(kube, None, *dry_create, stdin=pod).returncode == 0

    # A Pod the operator did not make may not be deleted by it.
    kube.kubectl("create", "-f", "-", stdin=json.dumps(_bare_pod(namespace, "theirs")))
    deleted = _as(kube, subject, "delete", "pod", "theirs", "-n", namespace, "--dry-run=server")
    assert deleted.returncode != 0 and "may delete only" in deleted.stderr, deleted

    # A Secret that is not an agent-token Secret may not be changed (a server-side apply: a
    # patch sent without reading the Secret first, as the operator's renewal does).
    secret = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "app-credentials", "namespace": namespace},
        "stringData": {"token": "the application's"},
    }  # fmt: skip
    kube.kubectl("create", "-f", "-", stdin=json.dumps(secret))
    secret["stringData"] = {"token": "the operator's"}
    changed = _as(
        kube, subject, "apply", "--server-side", "--force-conflicts", "--dry-run=server",
        "-f", "-", stdin=json.dumps(secret),
    )  # fmt: skip
    assert changed.returncode != 0, changed
    assert "updates only the token of a Sandbox's agent-token Secret" in changed.stderr, changed

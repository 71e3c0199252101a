"""Named approvals on the tier-2 API server: the chart's approval policy, test users' rights
and kubectl as an impersonated user (docs/approvals.md).

Test users are impersonated by the admin (``kubectl --as USER --as-group G``): the API server
authenticates the admin's certificate, then authorizes the impersonation and runs admission
with the impersonated identity, exactly the ``request.userInfo`` a real user's token gives.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any

from tests.support.helm import run_helm
from tests.support.operator import CHART_DIR, Cluster, plancommit_manifest, wait_for

POLICY_TEMPLATE = "templates/approval-policy.yaml"
CREATED_BY = "sandbox.cleveragents.io/created-by"
REQUIRED_LABEL = "sandbox.cleveragents.io/approval-required"


def approval_policy_yaml(server: Any, release: str, *values: str) -> str:
    """The chart's approval ValidatingAdmissionPolicy and binding as ``helm template`` renders
    them with ``approvals.policy.enabled=true`` and ``values`` (``key=value`` strings)."""
    sets = [arg for value in values for arg in ("--set", value)]
    result = run_helm(
        server.bin_dir / "helm", "template", release, str(CHART_DIR), "--namespace",
        "sandbox-system", "--show-only", POLICY_TEMPLATE, "--set",
        "approvals.policy.enabled=true", *sets,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def install_approval_policy(server: Any, cluster: Cluster, release: str, *values: str) -> str:
    """Install the policy and wait until the API server enforces it (a server-side dry-run
    create with an approval is refused); returns the YAML to ``kubectl delete -f -``."""
    manifest = approval_policy_yaml(server, release, *values)
    server.kubectl("apply", "-f", "-", input=manifest, check=True)
    probe = plancommit_manifest("policy-probe", "probe", approval="Required")
    probe["spec"]["approvals"] = [entry("sandbox-test-admin", "sha256:" + "0" * 64)]

    def enforced() -> bool:
        result = cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
        )
        return result.returncode != 0 and "created without approvals" in result.stderr

    wait_for(enforced, 60, "the approval policy in effect")
    return manifest


def grant_plancommit_rights(cluster: Cluster) -> None:
    """Every authenticated user may read, create and patch PlanCommits in ``cluster``'s
    namespace (what an approver's and an engine's Role would give)."""
    name = f"{cluster.namespace}-plancommit-editor"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name},
        "rules": [
            {
                "apiGroups": ["sandbox.cleveragents.io"],
                "resources": ["plancommits", "sandboxes"],
                "verbs": ["get", "list", "watch", "create", "patch", "update"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Group",
                "name": "system:authenticated",
            }
        ],
    }
    cluster.create(role)
    cluster.create(binding)


def entry(
    user: str,
    digest: str,
    decision: str = "Approve",
    groups: Sequence[str] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    """One ``spec.approvals`` entry."""
    found: dict[str, Any] = {"digest": digest, "decision": decision, "user": user}
    if groups is not None:
        found["groups"] = list(groups)
    if uid is not None:
        found["uid"] = uid
    return found


def as_user(
    cluster: Cluster,
    user: str,
    *args: str,
    groups: Sequence[str] = (),
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """kubectl in ``cluster``'s namespace as ``user`` (with ``groups``), never raising."""
    who = [f"--as={user}", *(f"--as-group={group}" for group in groups)]
    result: subprocess.CompletedProcess[str] = cluster.kubectl(
        *who, *args, input=input, check=False
    )
    return result


def add_approval(
    cluster: Cluster,
    name: str,
    user: str,
    value: dict[str, Any],
    groups: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Append ``value`` to ``spec.approvals`` of PlanCommit ``name`` as ``user`` (a JSON
    patch: ``add /spec/approvals/-``, or the whole list when there is none yet)."""
    current = (cluster.get("plancommit", name) or {}).get("spec", {}).get("approvals")
    patch = (
        [{"op": "add", "path": "/spec/approvals/-", "value": value}]
        if current
        else [{"op": "add", "path": "/spec/approvals", "value": [value]}]
    )
    return as_user(
        cluster,
        user,
        "patch",
        "plancommit",
        name,
        "--type",
        "json",
        "-p",
        json.dumps(patch),
        groups=groups,
    )


def create_as(
    cluster: Cluster, user: str, manifest: dict[str, Any], groups: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` ``manifest`` as ``user``."""
    return as_user(cluster, user, "create", "-f", "-", groups=groups, input=json.dumps(manifest))


def created_by(manifest: dict[str, Any], user: str) -> dict[str, Any]:
    """``manifest`` with the creator annotation naming ``user``."""
    manifest.setdefault("metadata", {}).setdefault("annotations", {})[CREATED_BY] = user
    return manifest


CREATOR_TEMPLATE = "templates/approval-creator-policy.yaml"


def install_creator_policy(server: Any, cluster: Cluster, release: str) -> str:
    """Install the chart's MutatingAdmissionPolicy that stamps a PlanCommit's creator
    (``approvals.stampCreator=true``, v1beta1 as the tier-2 server serves it) and wait until a
    server-side dry-run create is stamped; returns the YAML to ``kubectl delete -f -``."""
    result = run_helm(
        server.bin_dir / "helm", "template", release, str(CHART_DIR), "--namespace",
        "sandbox-system", "--show-only", CREATOR_TEMPLATE, "--set", "approvals.stampCreator=true",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = result.stdout
    server.kubectl("apply", "-f", "-", input=manifest, check=True)
    probe = json.dumps(plancommit_manifest("creator-probe", "probe"))

    def stamped() -> bool:
        created = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe, check=False
        )
        if created.returncode != 0:
            return False
        annotations = json.loads(created.stdout)["metadata"].get("annotations") or {}
        return CREATED_BY in annotations

    wait_for(stamped, 60, "the creator policy in effect")
    return manifest

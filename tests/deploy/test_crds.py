"""The CRDs in crds/: static schema checks, and the real API server enforcing them (tier 2).

Static: the contract in briefs (group, names, categories, printer columns), a ``description`` on
every field (``kubectl explain`` must be useful), structural schemas, the CEL rules, the declared
status fields (case 15) and docs/crd-reference.md being up to date.

API server (marked ``apiserver`` by its fixture): the CRDs become Established, the examples are
accepted, invalid objects are rejected with the exact messages below, ``kubectl explain`` shows the
descriptions, ``kubectl get sbx`` shows the printer columns, and a status patch keeps declared
fields while pruning undeclared ones (case 15).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox_api import models
from tests.support.apiserver.harness import LocalApiServer

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "crds"
EXAMPLES_DIR = REPO_ROOT / "examples"
GROUP = "sandbox.cleveragents.io"
VERSION = "v1beta1"
OLD_VERSION = "v1alpha1"

EXPECTED_NAMES = {
    "Sandbox": ("sandboxes", "sbx"),
    "Checkpoint": ("checkpoints", "ckpt"),
    "PlanCommit": ("plancommits", "pcommit"),
}
EXPECTED_COLUMNS = {
    "Sandbox": {
        "Phase": ".status.phase",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Strategy": ".spec.strategy",
        "Plan": ".spec.planId",
        "Age": ".metadata.creationTimestamp",
    },
    "Checkpoint": {
        "Sandbox": ".spec.sandboxName",
        "Phase": ".spec.phase",
        "Ready": '.status.conditions[?(@.type=="Ready")].status',
        "Age": ".metadata.creationTimestamp",
    },
    "PlanCommit": {
        "Plan": ".spec.planId",
        "Action": ".spec.action",
        "Phase": ".status.phase",
        "Approved-By": ".status.approvedBy",
        "Committed": '.status.conditions[?(@.type=="Committed")].status',
        "Age": ".metadata.creationTimestamp",
    },
}
# Every field the operator writes under .status (CRD contract; case 15: undeclared are pruned).
EXPECTED_STATUS_FIELDS = {
    "Sandbox": {
        "phase", "sandboxId", "sandboxPath", "workspacePod", "effectiveStrategy", "strategyMode",
        "executor", "lastCommit", "lastRollbackRequestId", "lastRestoreRequestId", "coreRecord",
        "conditions", "observedGeneration", "lastHandledConfiguration",
    },
    "Checkpoint": {
        "phase", "checkpointId", "sandboxId", "snapshotLocation", "kind", "createdAt",
        "conditions", "observedGeneration", "lastHandledConfiguration",
    },
    "PlanCommit": {
        "phase", "sandboxes", "results", "rolledBackIds", "failedRollbackIds", "failedSandboxId",
        "startedAt", "completedAt", "conditions", "observedGeneration",
        "mode", "twoPhase", "review",  # issue 9
        "lastHandledConfiguration",  # kopf's diff-base, issue 11
        "approvals", "approvedBy",  # named approvals (docs/approvals.md)
        "validation", "discardedSandboxes",  # forks and pre-commit checks (docs/forks.md)
    },
}  # fmt: skip
# (kind, dotted path below openAPIV3Schema.properties) of every immutable field.
IMMUTABLE_FIELDS = [
    ("Sandbox", "spec.planId"),
    ("Sandbox", "spec.resourceId"),
    ("Sandbox", "spec.strategy"),
    ("Sandbox", "spec.source"),
    ("Checkpoint", "spec.sandboxName"),
    ("Checkpoint", "spec.phase"),
    ("PlanCommit", "spec.planId"),
    ("PlanCommit", "spec.action"),
    ("PlanCommit", "spec.mode"),
    ("PlanCommit", "spec.approval"),
]
STRUCTURAL_KEYS_FORBIDDEN = ("$ref", "allOf", "anyOf", "oneOf", "not", "definitions")


def _load_crds() -> dict[str, dict[str, Any]]:
    crds = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        crds[doc["spec"]["names"]["kind"]] = doc
    return crds


CRDS = _load_crds()


def _version(kind: str, name: str = VERSION) -> dict[str, Any]:
    (version,) = [v for v in CRDS[kind]["spec"]["versions"] if v["name"] == name]
    return version  # type: ignore[no-any-return]


def _root(kind: str) -> dict[str, Any]:
    return _version(kind)["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def _at(kind: str, dotted: str) -> dict[str, Any]:
    node = _root(kind)
    for part in dotted.split("."):
        node = node["properties"][part]
    return node


def _walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below ``schema`` (properties, array items, map values) with its path."""
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child
        yield from _walk(child, child_path)
    items = schema.get("items")
    if isinstance(items, dict):
        yield f"{path}[]", items
        yield from _walk(items, f"{path}[]")
    values = schema.get("additionalProperties")
    if isinstance(values, dict):
        yield f"{path}{{}}", values
        yield from _walk(values, f"{path}{{}}")


def _rules(node: dict[str, Any]) -> dict[str, str]:
    return {r["rule"]: r["message"] for r in node.get("x-kubernetes-validations", [])}


# --- static checks ------------------------------------------------------------------------


def test_one_file_per_crd_with_contract_names() -> None:
    assert sorted(p.name for p in CRD_DIR.glob("*.yaml")) == [
        "checkpoints.yaml",
        "plancommits.yaml",
        "sandboxes.yaml",
    ]
    for kind, (plural, short) in EXPECTED_NAMES.items():
        crd = CRDS[kind]
        assert crd["metadata"]["name"] == f"{plural}.{GROUP}"
        spec = crd["spec"]
        assert spec["group"] == GROUP
        assert spec["scope"] == "Namespaced"
        assert spec["names"]["plural"] == plural
        assert spec["names"]["shortNames"] == [short]
        # A category named like the plural would make `kubectl get sandboxes` a category query.
        assert spec["names"]["categories"] == ["sandbox-all"]
        version = _version(kind)
        assert (version["name"], version["served"], version["storage"]) == (VERSION, True, True)
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_v1alpha1_served_deprecated_and_converted_losslessly(kind: str) -> None:
    """v1beta1 is stored; v1alpha1 is served with a deprecation warning. ``None`` conversion
    only rewrites apiVersion, so it is lossless only while both versions declare the same
    schema (every field, description and CEL rule), the same printer columns and subresources."""
    spec = CRDS[kind]["spec"]
    assert [v["name"] for v in spec["versions"]] == [VERSION, OLD_VERSION]
    assert spec["conversion"] == {"strategy": "None"}
    old, new = _version(kind, OLD_VERSION), _version(kind)
    assert (old["served"], old["storage"], old["deprecated"]) == (True, False, True)
    assert "deprecated" not in new
    assert old["deprecationWarning"] == (
        f"{GROUP}/{OLD_VERSION} {kind} is deprecated; "
        f"use {GROUP}/{VERSION} {kind} (the same fields)"
    )
    for key in ("schema", "additionalPrinterColumns", "subresources"):
        assert old[key] == new[key], f"{kind}: {key} differs between the versions"


def test_versions_follow_the_contract_module() -> None:
    """sandbox_api.models names the version everybody reads and writes, and the served ones."""
    for crd in CRDS.values():
        versions = crd["spec"]["versions"]
        assert tuple(v["name"] for v in versions) == models.SERVED_VERSIONS
        assert [v["name"] for v in versions if v["storage"]] == [models.VERSION]
        assert tuple(v["name"] for v in versions if v.get("deprecated")) == (
            models.DEPRECATED_VERSIONS
        )


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_every_field_has_a_description(kind: str) -> None:
    root = _root(kind)
    # Scalar array items and map values are described by their array/map (kubectl explain);
    # the API server forbids anything but a type on metadata (the standard ObjectMeta).
    missing = [
        path
        for path, node in _walk(root)
        if not node.get("description", "").strip()
        and path != "metadata"
        and (node.get("type") == "object" or not path.endswith(("[]", "{}")))
    ]
    assert root.get("description"), f"{kind}: the root schema has no description"
    assert missing == [], f"{kind}: fields without a description: {missing}"


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_field_names_are_lower_camel_case(kind: str) -> None:
    """The API conventions' field names (v1beta1 review: nothing to rename). Map keys
    (``additionalProperties``) and the preserved core record are data, not fields."""
    bad = [
        path
        for path, _ in _walk(_root(kind))
        if not re.fullmatch(r"[a-z][a-zA-Z0-9]*", path.rsplit(".", 1)[-1].removesuffix("[]"))
        and not path.endswith("{}")
    ]
    assert bad == []


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_schema_is_structural(kind: str) -> None:
    """Every node has a type, arrays have items, and no construct the API server rejects."""
    problems = []
    assert _root(kind)["properties"]["metadata"] == {"type": "object"}
    for path, node in [("(root)", _root(kind)), *_walk(_root(kind))]:
        if "type" not in node:
            problems.append(f"{path}: no type")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{path}: array without items")
        if "properties" in node and isinstance(node.get("additionalProperties"), dict):
            problems.append(f"{path}: properties and additionalProperties together")
        problems += [f"{path}: uses {key}" for key in STRUCTURAL_KEYS_FORBIDDEN if key in node]
    assert problems == []


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_printer_columns(kind: str) -> None:
    columns = {c["name"]: c["jsonPath"] for c in _version(kind)["additionalPrinterColumns"]}
    for name, json_path in EXPECTED_COLUMNS[kind].items():
        assert columns.get(name) == json_path, f"{kind}: column {name}"
    visible = [
        c["name"] for c in _version(kind)["additionalPrinterColumns"] if not c.get("priority")
    ]
    assert visible == list(EXPECTED_COLUMNS[kind]), "default columns in contract order"


@pytest.mark.parametrize(("kind", "path"), IMMUTABLE_FIELDS)
def test_immutable_fields_have_transition_rule(kind: str, path: str) -> None:
    name = path.rsplit(".", 1)[1]
    assert _rules(_at(kind, path)).get("self == oldSelf") == f"{name} is immutable"


def test_sandbox_source_cel_rules() -> None:
    source = _at("Sandbox", "spec.source")
    assert any("filter(x, x).size() == 1" in rule for rule in _rules(source))
    assert set(source["properties"]) == {
        "persistentVolumeClaim", "nodePath", "secretRef", "fromCheckpoint",
    }  # fmt: skip
    spec_rules = _rules(_at("Sandbox", "spec"))
    fork_rule = (
        "!has(self.source.fromCheckpoint) || "
        "self.strategy in ['git_worktree', 'copy_on_write', 'overlay']"
    )
    assert set(spec_rules) == {
        "!has(self.source.secretRef) || self.strategy == 'transaction_rollback'",
        fork_rule,
    }
    assert spec_rules[fork_rule].startswith("source.fromCheckpoint is refused for strategies")
    assert _at("Sandbox", "spec.source.fromCheckpoint")["required"] == ["sandbox", "checkpoint"]
    sub_path = _rules(_at("Sandbox", "spec.source.persistentVolumeClaim.subPath"))
    assert set(sub_path.values()) == {
        "subPath must be a relative path (must not start with '/')",
        "subPath must not contain '..'",
    }
    node_path = _rules(_at("Sandbox", "spec.source.nodePath"))
    assert set(node_path.values()) == {
        "nodePath must be an absolute path (must start with '/')",
        "nodePath must not contain '..'",
    }
    assert _at("Sandbox", "spec.source.secretRef.key")["default"] == "dsn"


def test_sandbox_spec_contract() -> None:
    spec = _at("Sandbox", "spec")
    assert set(spec["required"]) == {"planId", "resourceId", "strategy", "source"}
    assert _at("Sandbox", "spec.strategy")["enum"] == [
        "git_worktree", "copy_on_write", "overlay", "transaction_rollback", "none",
    ]  # fmt: skip
    overlay_mode = _at("Sandbox", "spec.options.overlayMode")
    assert (overlay_mode["enum"], overlay_mode["default"]) == (
        ["auto", "kernel", "fallback"],
        "auto",
    )
    assert _at("Sandbox", "spec.ttlSecondsAfterFinished")["minimum"] == 0
    assert _at("Sandbox", "spec.rollbackRequest")["required"] == ["id"]
    assert set(_at("Sandbox", "spec.restoreRequest")["required"]) == {"id", "checkpointName"}
    for field in ("planId", "resourceId"):
        node = _at("Sandbox", f"spec.{field}")
        assert (node["minLength"], node["maxLength"]) == (1, 253)


def test_plancommit_and_checkpoint_spec_contract() -> None:
    action = _at("PlanCommit", "spec.action")
    assert (action["enum"], action["default"]) == (["Commit", "Rollback"], "Commit")
    policy = _at("PlanCommit", "spec.cleanupPolicy")
    assert (policy["enum"], policy["default"]) == (["Retain", "Delete"], "Retain")
    assert _at("Checkpoint", "spec.phase")["pattern"] == "^[a-z][a-z0-9_]*$"
    assert _at("Checkpoint", "spec.metadata")["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_status_declares_every_operator_field(kind: str) -> None:
    """Case 15: only coreRecord may keep unknown fields; everything else is declared."""
    status = _at(kind, "status")
    assert set(status["properties"]) == EXPECTED_STATUS_FIELDS[kind]
    preserving = [p for p, n in _walk(_root(kind)) if n.get("x-kubernetes-preserve-unknown-fields")]
    # spec.workspace.affinity is a Pod affinity, passed to the Pod as is (the API server
    # validates it when the operator creates the Pod).
    expected = ["spec.workspace.affinity", "status.coreRecord"] if kind == "Sandbox" else []
    assert preserving == expected


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_conditions_schema_like_metav1(kind: str) -> None:
    conditions = _at(kind, "status.conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    item = conditions["items"]
    assert set(item["required"]) >= {"type", "status", "reason", "lastTransitionTime"}
    props = item["properties"]
    assert props["status"]["enum"] == ["True", "False", "Unknown"]
    assert props["lastTransitionTime"]["format"] == "date-time"
    assert props["observedGeneration"]["type"] == "integer"
    assert props["reason"]["pattern"] == "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def test_plancommit_status_enums() -> None:
    assert _at("PlanCommit", "status.phase")["enum"] == [
        "Pending", "Committing", "Committed", "RollingBack", "RolledBack", "Failed",
        "AwaitingApproval", "Expired",
    ]  # fmt: skip
    journal_state = _at("PlanCommit", "status.sandboxes")["items"]["properties"]["state"]
    assert journal_state["enum"] == [
        "Pending", "Committing", "Committed", "Failed", "Compensating", "Compensated",
        "CompensationFailed", "Skipped", "Preparing", "Prepared", "Aborted",
    ]  # fmt: skip
    assert _at("Sandbox", "status.phase")["enum"] == [
        "Pending", "Created", "Active", "Committed", "RolledBack", "CleanedUp", "Errored",
        "Suspended",
    ]  # fmt: skip
    assert _at("Checkpoint", "status.phase")["enum"] == ["Pending", "Ready", "Failed"]


def test_crd_reference_doc_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "hack" / "gen-crd-docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc = (REPO_ROOT / "docs" / "crd-reference.md").read_text()
    assert "`spec.source.nodePath`" in doc
    assert "planId is immutable" in doc


def test_examples_cover_every_kind_and_strategy() -> None:
    docs = [
        doc
        for path in sorted(EXAMPLES_DIR.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["apiVersion"] == f"{GROUP}/{VERSION}"
    ]
    strategies = {d["spec"]["strategy"] for d in docs if d["kind"] == "Sandbox"}
    assert {"git_worktree", "copy_on_write", "overlay"} <= strategies
    actions = {d["spec"].get("action", "Commit") for d in docs if d["kind"] == "PlanCommit"}
    assert actions == {"Commit", "Rollback"}
    assert any(d["kind"] == "Checkpoint" for d in docs)


# --- real API server ----------------------------------------------------------------------


def _sandbox(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "planId": "plan-a",
        "resourceId": "repo",
        "strategy": "git_worktree",
        "source": {"nodePath": "/var/lib/sandbox-demo/repo"},
    }
    base.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {k: v for k, v in base.items() if v is not None},
    }


def _plancommit(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PlanCommit",
        "metadata": {"name": name},
        "spec": {"planId": "plan-a", **spec},
    }


@pytest.fixture(scope="module")
def crd_server(local_apiserver: LocalApiServer) -> LocalApiServer:
    """The shared API server with our CRDs applied and Established."""
    local_apiserver.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(CRD_DIR), check=True
    )
    for plural, _ in EXPECTED_NAMES.values():
        local_apiserver.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.{GROUP}", "--timeout=60s",
            check=True,
        )  # fmt: skip
    return local_apiserver


@pytest.fixture
def namespace(crd_server: LocalApiServer) -> str:
    """A fresh namespace per test (the shared server never deletes namespaces; names differ)."""
    name = f"crd-{uuid.uuid4().hex[:10]}"
    crd_server.kubectl("create", "namespace", name, check=True)
    return name


def _apply(
    server: LocalApiServer, namespace: str, obj: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return server.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))


def test_crds_established_and_examples_accepted(crd_server: LocalApiServer, namespace: str) -> None:
    for path in sorted(EXAMPLES_DIR.glob("*.yaml")):
        result = crd_server.kubectl("apply", "-n", namespace, "-f", str(path))
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
    listed = crd_server.kubectl("get", "sandbox-all", "-n", namespace, "-o", "name", check=True)
    names = set(listed.stdout.split())
    assert f"sandbox.{GROUP}/demo-repo" in names
    assert f"checkpoint.{GROUP}/demo-repo-pre-execute" in names
    assert f"plancommit.{GROUP}/plan-demo-1-rollback" in names
    # Defaults are applied by the API server.
    pc = crd_server.kubectl_json("get", "pcommit", "plan-demo-1-rollback", "-n", namespace)
    assert isinstance(pc, dict)
    assert pc["spec"]["action"] == "Rollback"
    db = crd_server.kubectl_json("get", "sbx", "demo-db", "-n", namespace)
    assert isinstance(db, dict)
    assert db["spec"]["source"]["secretRef"] == {"name": "demo-db", "key": "dsn"}


INVALID_CASES = [
    pytest.param(
        _sandbox("no-plan", planId=None),
        "spec.planId: Required value",
        id="missing-planId",
    ),
    pytest.param(
        _sandbox("no-source", source=None),
        "spec.source: Required value",
        id="missing-source",
    ),
    pytest.param(
        _sandbox("bad-strategy", strategy="rsync"),
        'spec.strategy: Unsupported value: "rsync": supported values: "git_worktree", '
        '"copy_on_write", "overlay", "transaction_rollback", "none"',
        id="bad-strategy",
    ),
    pytest.param(
        _sandbox(
            "two-sources",
            source={"nodePath": "/data/repo", "persistentVolumeClaim": {"claimName": "c"}},
        ),
        "spec.source: Invalid value: "
        "source must set exactly one of persistentVolumeClaim, nodePath or secretRef",
        id="two-sources",
    ),
    pytest.param(
        _sandbox("empty-source", source={}),
        "spec.source: Invalid value: "
        "source must set exactly one of persistentVolumeClaim, nodePath or secretRef",
        id="empty-source",
    ),
    pytest.param(
        _sandbox("secret-git", source={"secretRef": {"name": "db"}}),
        "spec.source.secretRef: Invalid value: "
        "source.secretRef is only valid with strategy transaction_rollback",
        id="secretRef-with-git_worktree",
    ),
    pytest.param(
        _sandbox(
            "dotdot",
            source={"persistentVolumeClaim": {"claimName": "c", "subPath": "repos/../etc"}},
        ),
        'spec.source.persistentVolumeClaim.subPath: Invalid value: "repos/../etc": '
        "subPath must not contain '..'",
        id="subPath-dotdot",
    ),
    pytest.param(
        _sandbox(
            "abs-subpath",
            source={"persistentVolumeClaim": {"claimName": "c", "subPath": "/etc"}},
        ),
        'spec.source.persistentVolumeClaim.subPath: Invalid value: "/etc": '
        "subPath must be a relative path (must not start with '/')",
        id="subPath-absolute",
    ),
    pytest.param(
        _sandbox("relative-node", source={"nodePath": "data/repo"}),
        'spec.source.nodePath: Invalid value: "data/repo": '
        "nodePath must be an absolute path (must start with '/')",
        id="nodePath-relative",
    ),
    pytest.param(
        _sandbox("dotdot-node", source={"nodePath": "/data/../etc"}),
        "spec.source.nodePath: Invalid value: \"/data/../etc\": nodePath must not contain '..'",
        id="nodePath-dotdot",
    ),
    pytest.param(
        _plancommit("bad-action", action="Merge"),
        'spec.action: Unsupported value: "Merge": supported values: "Commit", "Rollback"',
        id="plancommit-bad-action",
    ),
    pytest.param(
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Checkpoint",
            "metadata": {"name": "bad-label"},
            "spec": {"sandboxName": "s", "phase": "Pre-Execute"},
        },
        'spec.phase: Invalid value: "Pre-Execute": spec.phase in body should match '
        "'^[a-z][a-z0-9_]*$'",
        id="checkpoint-bad-phase-label",
    ),
]


@pytest.mark.parametrize(("obj", "message"), INVALID_CASES)
def test_invalid_objects_rejected_with_clear_message(
    crd_server: LocalApiServer, namespace: str, obj: dict[str, Any], message: str
) -> None:
    result = _apply(crd_server, namespace, obj)
    assert result.returncode != 0, f"accepted: {obj}"
    assert "is invalid" in result.stderr
    assert message in result.stderr


def test_dotdot_inside_a_name_is_not_traversal(crd_server: LocalApiServer, namespace: str) -> None:
    obj = _sandbox(
        "dots", source={"persistentVolumeClaim": {"claimName": "c", "subPath": "a..b/c"}}
    )
    result = _apply(crd_server, namespace, obj)
    assert result.returncode == 0, result.stderr


IMMUTABLE_CHANGES = [
    pytest.param({"planId": "plan-b"}, 'spec.planId: Invalid value: "plan-b": planId is immutable',
                 id="planId"),
    pytest.param({"resourceId": "other"},
                 'spec.resourceId: Invalid value: "other": resourceId is immutable',
                 id="resourceId"),
    pytest.param({"strategy": "copy_on_write"},
                 'spec.strategy: Invalid value: "copy_on_write": strategy is immutable',
                 id="strategy"),
    pytest.param({"source": {"nodePath": "/var/lib/sandbox-demo/other"}},
                 'spec.source: Invalid value: source is immutable', id="source"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), IMMUTABLE_CHANGES)
def test_immutable_sandbox_fields(
    crd_server: LocalApiServer, namespace: str, change: dict[str, Any], message: str
) -> None:
    name = "immutable"
    created = _apply(crd_server, namespace, _sandbox(name))
    assert created.returncode == 0, created.stderr
    patch = json.dumps({"spec": change})
    result = crd_server.kubectl("patch", "sbx", name, "-n", namespace, "--type=merge", "-p", patch)
    assert result.returncode != 0
    assert message in result.stderr
    # Mutable fields still change.
    mutable = {"spec": {"rollbackRequest": {"id": "r1"}, "ttlSecondsAfterFinished": 60}}
    ok = crd_server.kubectl(
        "patch", "sbx", name, "-n", namespace, "--type=merge", "-p", json.dumps(mutable)
    )
    assert ok.returncode == 0, ok.stderr


def test_immutable_plancommit_and_checkpoint_fields(
    crd_server: LocalApiServer, namespace: str
) -> None:
    assert _apply(crd_server, namespace, _plancommit("pc")).returncode == 0
    for change, message in (
        ({"planId": "plan-b"}, 'spec.planId: Invalid value: "plan-b": planId is immutable'),
        ({"action": "Rollback"}, 'spec.action: Invalid value: "Rollback": action is immutable'),
    ):
        result = crd_server.kubectl(
            "patch", "pcommit", "pc", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": change}),
        )  # fmt: skip
        assert result.returncode != 0
        assert message in result.stderr
    ckpt = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Checkpoint",
        "metadata": {"name": "ck"},
        "spec": {"sandboxName": "s", "phase": "pre_execute"},
    }
    assert _apply(crd_server, namespace, ckpt).returncode == 0
    result = crd_server.kubectl(
        "patch", "ckpt", "ck", "-n", namespace, "--type=merge",
        "-p", json.dumps({"spec": {"sandboxName": "t", "phase": "post_execute"}}),
    )  # fmt: skip
    assert result.returncode != 0
    assert 'spec.sandboxName: Invalid value: "t": sandboxName is immutable' in result.stderr
    assert 'spec.phase: Invalid value: "post_execute": phase is immutable' in result.stderr


def test_kubectl_explain_shows_descriptions(crd_server: LocalApiServer) -> None:
    source = crd_server.kubectl("explain", "sandbox.spec.source", check=True).stdout
    assert "Set exactly one of persistentVolumeClaim" in " ".join(source.split())
    assert "nodePath" in source
    assert "secretRef" in source
    spec = " ".join(crd_server.kubectl("explain", "sandbox.spec", check=True).stdout.split())
    assert "planId" in spec
    assert "How writes are isolated." in spec
    pcommit = " ".join(
        crd_server.kubectl("explain", "pcommit.spec.action", check=True).stdout.split()
    )
    assert "Commit (default)" in pcommit


def test_kubectl_get_sbx_printer_columns(crd_server: LocalApiServer, namespace: str) -> None:
    assert _apply(crd_server, namespace, _sandbox("cols")).returncode == 0
    status = {
        "status": {
            "phase": "Active",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "SandboxActive",
                    "message": "sandbox is usable",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
        }
    }
    crd_server.kubectl(
        "patch", "sbx", "cols", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status), check=True,
    )  # fmt: skip
    out = crd_server.kubectl("get", "sbx", "cols", "-n", namespace, check=True).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "READY", "STRATEGY", "PLAN", "AGE"]
    assert row.split()[:5] == ["cols", "Active", "True", "git_worktree", "plan-a"]


def test_status_patch_keeps_declared_and_prunes_undeclared(
    crd_server: LocalApiServer, namespace: str
) -> None:
    """Case 15, step 3: the probe field disappears, every declared field survives."""
    assert _apply(crd_server, namespace, _sandbox("pruned")).returncode == 0
    core_record = {"strategy": "git_worktree", "context": {"branch": "sandbox/x", "n": [1, 2]}}
    status = {
        "status": {
            "probe": 1,
            "phase": "Active",
            "sandboxId": "01JD0000000000000000000000",
            "coreRecord": core_record,
            "observedGeneration": 1,
            "lastCommit": {"success": True, "changedFiles": ["a.txt"], "undeclared": "x"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "SandboxActive",
                    "message": "ok",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                    "observedGeneration": 1,
                }
            ],
        }
    }
    crd_server.kubectl(
        "patch", "sbx", "pruned", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status), check=True,
    )  # fmt: skip
    got = crd_server.kubectl_json("get", "sbx", "pruned", "-n", namespace)
    assert isinstance(got, dict)
    stored = got["status"]
    assert "probe" not in stored
    assert "undeclared" not in stored["lastCommit"]
    assert stored["coreRecord"] == core_record
    assert stored["phase"] == "Active"
    assert stored["conditions"][0]["reason"] == "SandboxActive"
    assert stored["lastCommit"] == {"success": True, "changedFiles": ["a.txt"]}

    assert _apply(crd_server, namespace, _plancommit("pc-pruned")).returncode == 0
    pc_status = {
        "status": {
            "probe": "x",
            "phase": "RolledBack",
            "sandboxes": [{"name": "s1", "state": "Compensated", "rollbackable": True}],
            "results": [{"name": "s1", "success": False, "error": "conflict", "extra": 1}],
            "rolledBackIds": ["01JD0000000000000000000000"],
            "failedRollbackIds": [],
            "conditions": [
                {
                    "type": "Committed",
                    "status": "False",
                    "reason": "Compensated",
                    "message": "sandbox s2 failed: conflict",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
        }
    }
    crd_server.kubectl(
        "patch", "pcommit", "pc-pruned", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(pc_status), check=True,
    )  # fmt: skip
    pc = crd_server.kubectl_json("get", "pcommit", "pc-pruned", "-n", namespace)
    assert isinstance(pc, dict)
    assert "probe" not in pc["status"]
    assert pc["status"]["results"] == [{"name": "s1", "success": False, "error": "conflict"}]
    assert pc["status"]["sandboxes"][0]["state"] == "Compensated"
    assert pc["status"]["rolledBackIds"] == ["01JD0000000000000000000000"]
    # kubectl wait on the condition works with this schema.
    waited = crd_server.kubectl(
        "wait", "--for=condition=Committed=False", "pcommit/pc-pruned", "-n", namespace,
        "--timeout=10s",
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr


def test_status_rejects_bad_condition(crd_server: LocalApiServer, namespace: str) -> None:
    assert _apply(crd_server, namespace, _sandbox("badcond")).returncode == 0
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Maybe",
                    "reason": "not camel case",
                    "message": "",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ]
        }
    }
    result = crd_server.kubectl(
        "patch", "sbx", "badcond", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    assert result.returncode != 0
    assert 'status.conditions[0].status: Unsupported value: "Maybe"' in result.stderr
    assert "status.conditions[0].reason: Invalid value" in result.stderr


@pytest.mark.parametrize("kind", sorted(EXPECTED_NAMES))
def test_the_operator_cuts_condition_messages_to_the_schemas_length(kind: str) -> None:
    from sandbox_operator.kube.conditions import MAX_MESSAGE

    assert _at(kind, "status.conditions")["items"]["properties"]["message"]["maxLength"] == (
        MAX_MESSAGE
    )

"""Tier 3: a two-phase PlanCommit with a PostgreSQL sandbox in the real cluster.

PostgreSQL 15 runs in a Pod from the Debian-built image ``localhost/sandbox-e2e/postgres:15``
(``e2e/images/build.sh postgres``, imported by ``e2e/cluster up``) with
``max_prepared_transactions`` above zero. A ``transaction_rollback`` Sandbox reaches it from
its workspace Pod through the DSN of a Secret (``secretKeyRef``: the operator never reads it).
An actor writes one row through the workspace agent's SQL route (from the workspace Pod), the
PlanCommit prepares (``PREPARE TRANSACTION``), decides and applies (``COMMIT PREPARED``) through
the workspace agent, and the server is left with the row and no prepared transaction.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from e2e.conftest import plancommit_manifest
from e2e.kube import Kube, wait_until

IMAGE = os.environ.get("E2E_POSTGRES_IMAGE", "localhost/sandbox-e2e/postgres:15")
PULL_POLICY = os.environ.get("E2E_IMAGE_PULL_POLICY", "IfNotPresent")
TABLE = "tpc_items"
SOCKET_DIR = "/tmp"  # noqa: S108 - the server's socket directory in its Pod (an emptyDir)

# Run in the workspace Pod by the test, as an engine's actor would: one statement through the
# workspace agent's SQL route (wire.SQL), with the Pod's own token file; the agent runs it in the
# sandbox's transaction (logged; applied at commit only). Nothing re-opens the sandbox.
WRITE_SCRIPT = """
import json, sys, urllib.request
from sandbox_core.agent import wire
token = open(wire.TOKEN_FILE).read().strip()
body = {"sql": "INSERT INTO tpc_items (body) VALUES (%s)", "params": [sys.argv[2]]}
request = urllib.request.Request(
    f"http://127.0.0.1:{wire.DEFAULT_PORT}" + wire.SQL.path(sid=sys.argv[1]),
    data=json.dumps(body).encode(), method="POST",
    headers={"Authorization": "Bearer " + token, "Content-Type": wire.JSON_CONTENT_TYPE,
             wire.REQUEST_ID_HEADER: "e2e-actor-insert"},
)
with urllib.request.urlopen(request, timeout=30) as reply:
    assert json.load(reply)["rowcount"] == 1
"""


def postgres_pod() -> dict[str, Any]:
    """PostgreSQL in a Pod: restricted security context, data and sockets on emptyDirs."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "postgres", "labels": {"app": "postgres"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "postgres",
                    "image": IMAGE,
                    "imagePullPolicy": PULL_POLICY,
                    "env": [
                        {
                            "name": "POSTGRES_PASSWORD",
                            "valueFrom": {"secretKeyRef": {"name": "pg", "key": "password"}},
                        },
                        {"name": "POSTGRES_MAX_PREPARED", "value": "16"},
                    ],
                    "ports": [{"containerPort": 5432, "protocol": "TCP"}],
                    "readinessProbe": {"tcpSocket": {"port": 5432}, "periodSeconds": 1},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/var/lib/postgresql"},
                        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - in the Pod
                    ],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        },
    }


def psql(kube: Kube, namespace: str, sql: str) -> str:
    """Tuples-only output of ``sql`` on the server (local socket, as the postgres user)."""
    return kube.kubectl(
        "exec", "-n", namespace, "postgres", "--",
        "psql", "-h", SOCKET_DIR, "-U", "postgres", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql,
    ).strip()  # fmt: skip


def start_postgres(kube: Kube, namespace: str, password: str) -> str:
    """The server up and seeded; returns its Pod IP."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "pg"},
        "stringData": {"password": password},
    }
    kube.apply(namespace, secret, postgres_pod())
    kube.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/postgres", "--timeout=180s")
    wait_until("PostgreSQL accepts queries", lambda: _answers(kube, namespace), 60)
    assert psql(kube, namespace, "SHOW max_prepared_transactions") == "16"
    # No serial column: the actor's process consumes a sequence value that the verified replay
    # in the agent would not get again (docs/transaction-strategy.md, replay verification).
    psql(kube, namespace, f"CREATE TABLE {TABLE} (body text PRIMARY KEY)")
    return str(kube.json("get", "pod", "postgres", "-n", namespace)["status"]["podIP"])


def _answers(kube: Kube, namespace: str) -> bool:
    result = kube.kubectl(
        "exec", "-n", namespace, "postgres", "--",
        "psql", "-h", SOCKET_DIR, "-U", "postgres", "-At", "-c", "SELECT 1", check=False,
    )  # fmt: skip
    return str(result).strip() == "1"


def db_sandbox(name: str, plan: str, pod_ip: str) -> dict[str, Any]:
    """A transaction_rollback Sandbox of the server; egress opened to it alone."""
    return {
        "apiVersion": "sandbox.cleveragents.io/v1beta1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {
            "planId": plan,
            "resourceId": name,
            "strategy": "transaction_rollback",
            "source": {"secretRef": {"name": "db", "key": "dsn"}},
            "workspace": {
                "egress": [{"cidr": f"{pod_ip}/32", "ports": [{"port": 5432, "protocol": "TCP"}]}]
            },
        },
    }


def test_two_phase_plancommit_with_a_postgres_sandbox_in_the_cluster(
    kube: Kube, namespace: str
) -> None:
    password = f"pw{secrets.token_hex(12)}"
    pod_ip = start_postgres(kube, namespace, password)
    dsn = f"postgresql://postgres:{password}@{pod_ip}:5432/postgres?connect_timeout=5"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "db"},
        "stringData": {"dsn": dsn},
    }
    kube.apply(namespace, secret, db_sandbox("s-pg", "plan-tpc", pod_ip))
    status = kube.wait_phase("sandbox", namespace, "s-pg", {"Active", "Errored"}, timeout=240)
    assert status["phase"] == "Active", status
    # The actor's write, in the workspace Pod: logged in the sandbox, not on the server yet.
    kube.kubectl(
        "exec", "-n", namespace, status["workspacePod"], "-c", "workspace", "--",
        "python3", "-c", WRITE_SCRIPT, status["sandboxId"], "written in the sandbox",
    )  # fmt: skip
    assert psql(kube, namespace, "SELECT count(*) FROM tpc_items") == "0"

    commit = plancommit_manifest("pc-tpc", "plan-tpc")
    commit["spec"]["mode"] = "TwoPhase"
    kube.apply(namespace, commit)
    kube.kubectl(
        "wait", "-n", namespace, "--for=condition=Finished", "pcommit/pc-tpc", "--timeout=300s",
        check=False, timeout=330,
    )  # fmt: skip
    final = kube.status("plancommit", namespace, "pc-tpc")
    assert final.get("phase") == "Committed", json.dumps(final)[:3000]
    conditions = {c["type"]: c for c in final.get("conditions") or []}
    # Two-phase, not the saga fallback; the plan was reviewed (status.review's digest).
    assert conditions.get("TwoPhase", {}).get("reason") != "FellBackToSaga", conditions
    assert conditions.get("Reviewed", {}).get("status") == "True", conditions
    assert str((final.get("review") or {}).get("digest", "")).startswith("sha256:"), final

    # On the server: the row, and no prepared transaction left behind.
    assert psql(kube, namespace, "SELECT body FROM tpc_items") == "written in the sandbox"
    assert psql(kube, namespace, "SELECT count(*) FROM pg_prepared_xacts") == "0"
    # The sandbox was committed by COMMIT PREPARED of the plan's transaction (not by a commit).
    sandbox = kube.status("sandbox", namespace, "s-pg")
    last = (sandbox.get("coreRecord") or {}).get("last_commit") or {}
    metadata = last.get("metadata") or {}
    assert metadata.get("txid") and metadata.get("gid"), last
    # The password is in no status of the plan's objects.
    everything = kube.kubectl("get", "sandboxes,plancommits", "-n", namespace, "-o", "json")
    assert password not in everything

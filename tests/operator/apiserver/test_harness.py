"""The tier-2 harness against the real etcd + kube-apiserver it starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.apiserver.harness import LocalApiServer, StartupError

GROUP = "harness.test.sandbox.cleveragents.io"

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"widgets.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["replicas", "maxReplicas", "source"],
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.replicas <= self.maxReplicas",
                                        "message": "replicas must not exceed maxReplicas",
                                    }
                                ],
                                "properties": {
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                    "source": {
                                        "type": "string",
                                        "x-kubernetes-validations": [
                                            {"rule": "self == oldSelf", "message": "is immutable"}
                                        ],
                                    },
                                },
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


def widget(name: str, *, replicas: int, max_replicas: int, source: str = "git") -> str:
    return json.dumps(
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": replicas, "maxReplicas": max_replicas, "source": source},
        }
    )


@pytest.fixture(scope="module")
def widget_crd(local_apiserver: LocalApiServer) -> str:
    """Installs the Widget CRD once and waits until it is Established; returns its name."""
    name = WIDGET_CRD["metadata"]["name"]  # type: ignore[index]
    local_apiserver.kubectl("apply", "-f", "-", input=json.dumps(WIDGET_CRD), check=True)
    local_apiserver.kubectl(
        "wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s", check=True
    )
    return str(name)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_readyz_is_ok(local_apiserver: LocalApiServer) -> None:
    assert local_apiserver.running
    assert re.fullmatch(r"https://127\.0\.0\.1:\d+", local_apiserver.server_url)
    status, body = local_apiserver.get("/readyz")
    assert (status, body.strip()) == (200, "ok")
    raw = local_apiserver.kubectl("get", "--raw", "/readyz?verbose", check=True)
    assert "[+]etcd ok" in raw.stdout
    assert "readyz check passed" in raw.stdout


def test_kubectl_and_server_report_the_built_version(local_apiserver: LocalApiServer) -> None:
    version = json.loads(local_apiserver.kubectl("version", "-o", "json", check=True).stdout)
    server = version["serverVersion"]["gitVersion"]
    client = version["clientVersion"]["gitVersion"]
    assert re.fullmatch(r"v1\.\d+\.\d+", server), server
    assert client == server
    assert version["serverVersion"]["minor"] == server.split(".")[1]
    apiserver_version = local_apiserver.kubectl_path.with_name("kube-apiserver")
    printed = subprocess.run(
        [str(apiserver_version), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert printed.strip() == f"Kubernetes {server}"
    # The build script caches under <cache>/<version>/bin.
    if re.fullmatch(r"v\d+\.\d+\.\d+", local_apiserver.bin_dir.parent.name):
        assert local_apiserver.bin_dir.parent.name == server


def test_admin_is_authorized_and_rbac_is_enforced(local_apiserver: LocalApiServer) -> None:
    assert local_apiserver.kubectl("auth", "can-i", "*", "*", check=True).stdout.strip() == "yes"
    denied = local_apiserver.kubectl("get", "configmaps", "--as=nobody-in-particular")
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()


def test_configmap_round_trip(local_apiserver: LocalApiServer) -> None:
    name = unique("harness")
    local_apiserver.kubectl(
        "create", "configmap", name, "--from-literal=plan=ship it", "-n", "default", check=True
    )
    got = local_apiserver.kubectl_json("get", "configmap", name, "-n", "default")
    assert isinstance(got, dict)
    assert got["data"] == {"plan": "ship it"}
    assert got["metadata"]["uid"]
    local_apiserver.kubectl("delete", "configmap", name, "-n", "default", check=True)
    gone = local_apiserver.kubectl("get", "configmap", name, "-n", "default")
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr


def test_crd_cel_rule_accepts_valid_and_rejects_invalid(
    local_apiserver: LocalApiServer, widget_crd: str
) -> None:
    good = unique("good")
    local_apiserver.kubectl(
        "apply", "-f", "-", input=widget(good, replicas=1, max_replicas=3), check=True
    )
    stored = local_apiserver.kubectl_json("get", "widget", good, "-n", "default")
    assert isinstance(stored, dict)
    assert stored["spec"]["replicas"] == 1

    bad = unique("bad")
    rejected = local_apiserver.kubectl(
        "apply", "-f", "-", input=widget(bad, replicas=5, max_replicas=3)
    )
    assert rejected.returncode != 0
    assert rejected.stderr.strip() == (
        f'The Widget "{bad}" is invalid: spec: Invalid value: replicas must not exceed maxReplicas'
    )
    assert local_apiserver.kubectl("get", "widget", bad, "-n", "default").returncode != 0


def test_crd_cel_transition_rule_makes_a_field_immutable(
    local_apiserver: LocalApiServer, widget_crd: str
) -> None:
    name = unique("immutable")
    local_apiserver.kubectl(
        "apply", "-f", "-", input=widget(name, replicas=1, max_replicas=1), check=True
    )
    changed = local_apiserver.kubectl(
        "apply", "-f", "-", input=widget(name, replicas=1, max_replicas=1, source="oci")
    )
    assert changed.returncode != 0
    assert "spec.source: Invalid value" in changed.stderr
    assert "is immutable" in changed.stderr


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    """An empty directory, removed afterwards (pytest's tmp_path also sweeps other runs' dirs)."""
    with tempfile.TemporaryDirectory(prefix="harness-test-") as name:
        yield Path(name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_second_server_starts_and_leaves_nothing_behind(
    local_apiserver: LocalApiServer, scratch_dir: Path
) -> None:
    with LocalApiServer(bin_dir=local_apiserver.bin_dir, temp_root=scratch_dir) as other:
        assert other.server_url != local_apiserver.server_url
        assert other.startup_seconds is not None
        assert other.kubectl("get", "namespaces", check=True).stdout
        assert other.kubeconfig_path.is_file()
        work_dir = other.work_dir
        pids = list(other.pids.values())
        assert sorted(other.pids) == ["etcd", "kube-apiserver"]
        assert all(_alive(pid) for pid in pids)
    assert work_dir.parent == scratch_dir
    assert not work_dir.exists()
    assert not any(_alive(pid) for pid in pids)
    assert not other.running


def test_start_failure_reports_the_log_tail_and_cleans_up(
    local_apiserver: LocalApiServer, scratch_dir: Path
) -> None:
    server = LocalApiServer(
        bin_dir=local_apiserver.bin_dir,
        extra_apiserver_args=["--no-such-flag=1"],
        temp_root=scratch_dir,
    )
    with pytest.raises(StartupError) as raised:
        server.start()
    message = str(raised.value)
    assert "kube-apiserver exited before it became ready" in message
    assert "unknown flag: --no-such-flag" in message
    assert list(scratch_dir.iterdir()) == []
    assert not server.running

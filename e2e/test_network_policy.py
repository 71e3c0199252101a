"""The workspace Pods' NetworkPolicy, enforced on a real cluster (tier 3).

``e2e/cluster`` runs kube-network-policies (hack/build-k8s-binaries.sh --all), so the policy the
operator makes for each workspace Pod (operator/sandbox_operator/executors/pod_manifests.py,
``build_network_policy``) is enforced, not only stored:

- ingress: the agent answers the operator's Pod; a plain Pod of the same namespace that reaches
  another Pod fine cannot even open a connection to the agent's port;
- egress: a workspace Pod cannot open a connection to another Pod, unless
  ``spec.workspace.egress`` names that Pod's address and port (and then only that port).

A connection attempt is a TCP connect with a short timeout from inside a Pod: a dropped SYN
reads as ``timeout`` (the controller drops, it does not reject). A plain Pod reaching a listener
first shows that the pod network itself works, so a ``timeout`` is the policy and nothing else.
"""

from __future__ import annotations

import os
from typing import Any

from e2e.conftest import Originals, Release, active, sandbox_manifest
from e2e.kube import Kube, wait_until
from e2e.test_workspace_agent import AGENT_PORT, agent_token, call_from

LISTENER_PORTS = (8080, 8081)
CONNECT = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "s.settimeout(float(sys.argv[3]))\n"
    "try:\n"
    "    s.connect((sys.argv[1], int(sys.argv[2])))\n"
    "    print('open')\n"
    "except socket.timeout:\n"
    "    print('timeout')\n"
    "except ConnectionRefusedError:\n"
    "    print('refused')\n"
    "except OSError as e:\n"
    "    print('error', e.errno)\n"
)


def connect(
    kube: Kube, namespace: str, pod: str, ip: str, port: int, *, container: str | None = None
) -> str:
    """``open``, ``timeout``, ``refused`` or ``error N``: a TCP connect from ``pod`` (5 s)."""
    args = ["exec", "-n", namespace, pod]
    if container:
        args += ["-c", container]
    out = kube.kubectl(*args, "--", "python3", "-c", CONNECT, ip, str(port), "5")
    return out.strip()


def listener(kube: Kube, namespace: str) -> str:
    """A plain Pod of the project image serving HTTP on ``LISTENER_PORTS``; its IP."""
    image = os.environ.get("E2E_IMAGE", "localhost/sandbox-operator:e2e")
    servers = " & ".join(
        f"python3 -m http.server {port} --bind 0.0.0.0 --directory /tmp" for port in LISTENER_PORTS
    )
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "listener", "labels": {"app": "listener"}},
        "spec": {
            "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "listener",
                    "image": image,
                    "imagePullPolicy": os.environ.get("E2E_IMAGE_PULL_POLICY", "IfNotPresent"),
                    "command": ["sh", "-c", f"{servers} & wait"],
                    "readinessProbe": {"tcpSocket": {"port": LISTENER_PORTS[0]}},
                }
            ],
        },
    }
    kube.apply(namespace, pod)
    kube.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/listener", "--timeout=120s")
    return str(kube.json("get", "pod", "listener", "-n", namespace)["status"]["podIP"])


def workspace_ip(kube: Kube, namespace: str, status: dict[str, Any]) -> str:
    return str(kube.json("get", "pod", status["workspacePod"], "-n", namespace)["status"]["podIP"])


def test_the_agent_admits_the_operator_and_no_other_pod(
    kube: Kube, namespace: str, originals: Originals, operator_release: Release
) -> None:
    other_ip = listener(kube, namespace)
    kube.apply(namespace, sandbox_manifest("s-git", "plan-np", "git_worktree", "repos/app"))
    status = active(kube, namespace, "s-git")
    policy = kube.json("get", "networkpolicy", "-n", namespace)["items"]
    assert [p["spec"]["policyTypes"] for p in policy] == [["Ingress", "Egress"]]
    ip = workspace_ip(kube, namespace, status)
    # The operator's Pod: connects, and its call with the Sandbox's token is served.
    operator_pod = operator_release.pod_names(kube)[0]
    assert connect(kube, operator_release.namespace, operator_pod, ip, AGENT_PORT) == "open"
    token = agent_token(kube, namespace, "s-git")
    url = f"http://{ip}:{AGENT_PORT}/v1/sandboxes/{status['sandboxId']}"
    code, body = call_from(kube, operator_release.namespace, operator_pod, url, token)
    assert code == 200, body
    # A plain Pod: the pod network works for it (another Pod answers) ...
    assert connect(kube, namespace, originals.pod, other_ip, LISTENER_PORTS[0]) == "open"
    # ... but the agent's port is closed to it, and so is every other port of the workspace Pod.
    assert connect(kube, namespace, originals.pod, ip, AGENT_PORT) == "timeout"
    assert connect(kube, namespace, originals.pod, ip, LISTENER_PORTS[0]) == "timeout"

    # The kubelet's readiness probe (from the node, not a Pod) still reaches the agent.
    def ready() -> bool:
        pod = kube.json("get", "pod", status["workspacePod"], "-n", namespace)
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        return conditions.get("Ready") == "True"

    wait_until("the workspace Pod Ready", ready, 30)


def test_workspace_egress_is_denied_unless_the_field_opens_it(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    other_ip = listener(kube, namespace)
    closed = sandbox_manifest("s-closed", "plan-eg", "copy_on_write", "data")
    opened = sandbox_manifest("s-open", "plan-eg", "git_worktree", "repos/app")
    opened["spec"]["workspace"] = {
        "egress": [{"cidr": f"{other_ip}/32", "ports": [{"port": LISTENER_PORTS[0]}]}]
    }
    kube.apply(namespace, closed, opened)
    closed_status = active(kube, namespace, "s-closed")
    open_status = active(kube, namespace, "s-open")

    def from_workspace(status: dict[str, Any], port: int) -> str:
        return connect(
            kube, namespace, status["workspacePod"], other_ip, port, container="workspace"
        )

    # Denied by default, on every port ...
    for port in LISTENER_PORTS:
        assert from_workspace(closed_status, port) == "timeout", port
    # ... open exactly where spec.workspace.egress says (the listener, first port only).
    first = LISTENER_PORTS[0]
    wait_until("egress open", lambda: from_workspace(open_status, first) == "open", 30)
    assert from_workspace(open_status, LISTENER_PORTS[1]) == "timeout"
    # The plain Pod has no policy: it reaches both ports (the listener serves them).
    for port in LISTENER_PORTS:
        assert connect(kube, namespace, originals.pod, other_ip, port) == "open", port

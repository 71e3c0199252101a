"""A multi-node control plane for tests: the real kube-scheduler and kube-controller-manager
on a tier-2 etcd + kube-apiserver, with fake Nodes the scheduler places Pods on.

`MultiNodeCluster` starts its own `LocalApiServer`, then ``kube-scheduler`` (which decides every
placement) and ``kube-controller-manager`` with the controllers the tier needs:
``persistentvolume-binder-controller`` (binds claims to volumes),
``persistentvolume-attach-detach-controller`` (attaches volumes to nodes and refuses a
ReadWriteOnce volume on a second node: "Multi-Attach error"), ``garbage-collector-controller``
(children go with their owner) and ``deployment-controller`` / ``replicaset-controller`` (the
chart's Deployment makes its Pods). ``node-lifecycle-controller`` stays off: nothing renews the
fake Nodes' heartbeats, and it would taint them unreachable.

What stands in for the parts that are not under test (docs/testing-tiers.md, "Multi-node tier"):

* the Nodes are API objects (capacity, ``Ready``, the annotation that hands their volumes to the
  attach-detach controller);
* :class:`FakeKubelet` reports a bound Pod ``Running`` once every attachable volume of the Pod is
  in its Node's ``status.volumesAttached`` (as the kubelet waits for the attach before it mounts);
  the Pod's ``Ready`` is ``ready_pods`` (no container runs). Within :meth:`FakeKubelet.agents`
  a workspace Pod's main process runs instead: the real workspace agent on a loopback IP of the
  Pod's own (`tests.support.kubelet.Kubelet`), and the Pod is ``Running`` and ``Ready`` once the
  agent answers its readiness probe;
* it plays the dynamic provisioner for claims without a class (a hostPath volume each: the
  scratch claims; the binder binds them);
* it also plays the CSI driver's external attacher: a VolumeAttachment of :data:`CSI_DRIVER` is
  marked ``attached``. Which VolumeAttachments exist is the attach-detach controller's decision.

Typical use::

    with MultiNodeCluster(nodes=3) as cluster:
        cluster.kubectl("get", "nodes", check=True)
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.support.apiserver.harness import (
    ApiServerHarnessError,
    LocalApiServer,
    StartupError,
    _Process,
)
from tests.support.kubelet import Kubelet
from tests.support.operator import Cluster

CSI_DRIVER = "attach.csi.sandbox.test"
CONTROLLERS = (
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
)
NODE_PREFIX = "node-"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ZONE_LABEL = "topology.kubernetes.io/zone"
MANAGED_ATTACH = "volumes.kubernetes.io/controller-managed-attach-detach"
WORKSPACE_COMMAND = ["sandbox-core", "serve-workspace"]


@dataclass(frozen=True)
class AgentSettings:
    """How :meth:`FakeKubelet.agents` runs workspace agents: the operator's agent ``port``
    (every agent listens on it, each on its Pod's IP), a ``work`` directory (one directory per
    Pod below it: token files, state, log; ``work/claims/<claim>``: a source claim's files,
    shared by every Pod that mounts it, as a ReadWriteMany volume is) and the ``dsn`` of a
    Secret source (``""``: none)."""

    port: int
    work: Path
    dsn: str = ""


def node_manifest(name: str, zone: str) -> dict[str, Any]:
    """A Node object the scheduler can place Pods on (status is written separately)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {HOSTNAME_LABEL: name, ZONE_LABEL: zone, "kubernetes.io/os": "linux"},
            # Without it the attach-detach controller leaves the node's volumes to its kubelet.
            "annotations": {MANAGED_ATTACH: "true"},
        },
        "spec": {},
    }


def node_status(cpu: str = "8", memory: str = "32Gi", pods: str = "110") -> dict[str, Any]:
    """A Ready node's status: capacity, allocatable and the ``Ready`` condition."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "100Gi"}
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "fake node of the multi-node test tier",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }


def _condition(kind: str, status: bool, reason: str = "") -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = {"type": kind, "status": "True" if status else "False", "lastTransitionTime": now}
    if reason:
        out["reason"] = reason
    return out


class FakeKubelet:
    """The kubelets of the fake Nodes and the CSI external attacher, as one polling thread.

    Every ``interval`` seconds: each VolumeAttachment of :data:`CSI_DRIVER` that is not
    attached is marked attached; each Pod bound to a fake Node and still ``Pending`` becomes
    ``Running`` (podIP ``127.0.0.<n>``) once its attachable volumes are attached to that Node.
    ``ready_pods`` sets the Pods' ``Ready`` condition. Within :meth:`agents`, a workspace Pod
    (command ``sandbox-core serve-workspace``) runs its agent instead and becomes ``Running``
    and ``Ready`` once the agent answers; an agent stops when its Pod is deleted or ends
    (phase ``Failed`` or ``Succeeded``). ``server`` (the `LocalApiServer`) is needed for agents.
    """

    def __init__(
        self,
        api: client.ApiClient,
        interval: float = 0.3,
        ready_pods: bool = False,
        server: LocalApiServer | None = None,
    ):
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.interval = interval
        self.ready_pods = ready_pods
        self.server = server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-kubelet", daemon=True)
        self._next_ip = 2
        self._round = threading.Lock()  # one round at a time; agents start and stop under it
        self._agent_settings: AgentSettings | None = None
        self._agents: dict[str, Kubelet] = {}  # by Pod uid
        self._serving: set[str] = set()  # uids of the Pods reported Ready
        self.errors: list[str] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._round:
            self._stop_agents()

    @contextlib.contextmanager
    def agents(self, settings: AgentSettings) -> Iterator[None]:
        """Within: run each new workspace Pod's agent (`Kubelet`) on a loopback IP of its own;
        at the end every agent started here is stopped, whatever happened."""
        if self.server is None:
            raise ValueError("agents need the API server (FakeKubelet(server=...))")
        with self._round:
            self._agent_settings = settings
        try:
            yield
        finally:
            with self._round:
                self._agent_settings = None
                self._stop_agents()

    def agent(self, namespace: str, name: str) -> Kubelet | None:
        """The running agent of Pod ``namespace/name``, if any."""
        with self._round:
            for kubelet in self._agents.values():
                if kubelet.cluster.namespace == namespace and kubelet.pod == name:
                    return kubelet
        return None

    def _stop_agents(self) -> None:
        for uid in list(self._agents):
            self._stop_agent(uid)

    def _stop_agent(self, uid: str) -> None:
        kubelet = self._agents.pop(uid)
        self._serving.discard(uid)
        try:
            kubelet.stop()
        except Exception as exc:  # the others must still stop
            self.errors.append(f"stopping the agent of {kubelet.pod}: {exc!r}")
            if kubelet.agent is not None:
                kubelet.agent.kill()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with self._round:
                    self._provision()
                    self._attach()
                    self._start_pods()
            except ApiException as exc:  # a conflict or a deleted object: try again next round
                self.errors.append(f"{exc.status} {exc.reason}")
            except Exception as exc:  # the thread must outlive one bad round
                self.errors.append(repr(exc))

    def _provision(self) -> None:
        """The dynamic provisioner's part for claims without a class (the scratch claims): a
        volume of the requested size, made for the claim; the binder binds them."""
        for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            if pvc.spec.volume_name or pvc.spec.storage_class_name or pvc.status.phase != "Pending":
                continue
            name = f"pv-{pvc.metadata.uid}"
            volume = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": pvc.spec.resources.requests["storage"]},
                    "accessModes": pvc.spec.access_modes,
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "",
                    "hostPath": {"path": f"/nonexistent/{name}"},
                    "claimRef": {
                        "namespace": pvc.metadata.namespace,
                        "name": pvc.metadata.name,
                        "uid": pvc.metadata.uid,
                    },
                },
            }
            with contextlib.suppress(ApiException):  # made in an earlier round
                self.core.create_persistent_volume(volume)

    def _attach(self) -> None:
        for attachment in self.storage.list_volume_attachment().items:
            if attachment.spec.attacher != CSI_DRIVER:
                continue
            if attachment.status is not None and attachment.status.attached:
                continue
            self.storage.patch_volume_attachment_status(
                attachment.metadata.name, {"status": {"attached": True}}
            )

    def _attached_to(self, node: str) -> set[str]:
        found = self.core.read_node_status(node)
        return {v.name for v in (found.status.volumes_attached or [])}

    def _needs_attach(self, namespace: str, pod: client.V1Pod) -> set[str]:
        """Unique names (``kubernetes.io/csi/<driver>^<handle>``) of the Pod's CSI volumes."""
        names: set[str] = set()
        for volume in pod.spec.volumes or []:
            claim = volume.persistent_volume_claim
            if claim is None:
                continue
            pvc = self.core.read_namespaced_persistent_volume_claim(claim.claim_name, namespace)
            if not pvc.spec.volume_name:
                names.add(f"unbound claim {claim.claim_name}")  # never attached: stays Pending
                continue
            pv = self.core.read_persistent_volume(pvc.spec.volume_name)
            if pv.spec.csi is not None and pv.spec.csi.driver == CSI_DRIVER:
                names.add(f"kubernetes.io/csi/{CSI_DRIVER}^{pv.spec.csi.volume_handle}")
        return names

    def _start_pods(self) -> None:
        pods = self.core.list_pod_for_all_namespaces().items
        live = {
            pod.metadata.uid
            for pod in pods
            if not pod.metadata.deletion_timestamp
            and pod.status.phase not in ("Failed", "Succeeded")
        }
        for uid in set(self._agents) - live:  # the Pod went or ended: so does its container
            self._stop_agent(uid)
        for pod in pods:
            node = pod.spec.node_name
            if not node or not node.startswith(NODE_PREFIX) or pod.metadata.deletion_timestamp:
                if node and pod.metadata.deletion_timestamp:
                    # The kubelet's part of a graceful delete: the containers stopped.
                    with contextlib.suppress(ApiException):
                        self.core.delete_namespaced_pod(
                            pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                        )
                continue
            if pod.metadata.uid in self._agents:
                self._report_serving(pod)
                continue
            if pod.status.phase != "Pending":
                continue
            namespace = pod.metadata.namespace
            if not self._needs_attach(namespace, pod) <= self._attached_to(node):
                continue
            ip = self._new_ip()
            if self._agent_settings is not None and pod.spec.containers[0].command == (
                WORKSPACE_COMMAND
            ):
                self._start_agent(pod, ip)
                continue
            not_ready = "" if self.ready_pods else "ContainersNotReady"
            status = {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "conditions": [
                    _condition("PodScheduled", True),
                    _condition("Initialized", True),
                    _condition("ContainersReady", self.ready_pods, not_ready),
                    _condition("Ready", self.ready_pods, not_ready),
                ],
            }
            self.core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": status})

    def _new_ip(self) -> str:
        """``127.0.0.<n>``, n in 2..250 in turn, skipping the IPs of running agents."""
        taken = {kubelet.ip for kubelet in self._agents.values()}
        while True:
            ip = f"127.0.0.{self._next_ip}"
            self._next_ip = self._next_ip % 249 + 2
            if ip not in taken:
                return ip

    def _start_agent(self, pod: client.V1Pod, ip: str) -> None:
        """Run ``pod``'s agent (its token Secret or bootstrap Secret, its source claim's
        directory at the source mount); the Pod stays ``Pending`` until the agent answers."""
        settings = self._agent_settings
        assert settings is not None and self.server is not None
        namespace = pod.metadata.namespace
        volumes = {v.name: v for v in pod.spec.volumes or []}
        token = volumes.get("agent-token")
        source = volumes.get("source")
        claimed = source.persistent_volume_claim if source is not None else None
        directory = None
        if claimed is not None:
            directory = settings.work / "claims" / namespace / claimed.claim_name
            directory.mkdir(parents=True, exist_ok=True)
        kubelet = Kubelet(
            Cluster(self.server, namespace),
            settings.work / namespace / pod.metadata.name,
            settings.port,
            settings.dsn,
            pod=pod.metadata.name,
            secret=token.secret.secret_name if token is not None else "",
            ip=ip,
            source=directory,
        )
        kubelet.start_container()  # raises (tried again next round) or runs the agent
        self._agents[pod.metadata.uid] = kubelet

    def _report_serving(self, pod: client.V1Pod) -> None:
        """Once ``pod``'s agent answers its readiness probe: ``Running``, ``Ready``, its IP."""
        uid = pod.metadata.uid
        kubelet = self._agents[uid]
        if uid in self._serving:
            return
        if kubelet.agent is not None and kubelet.agent.poll() is not None:
            log = (kubelet.work / "agent.log").read_text(errors="replace")[-2000:]
            self.errors.append(f"the agent of {kubelet.pod} exited: {log}")
            self._stop_agent(uid)  # the next round starts it again, as a kubelet restarts it
            return
        if not kubelet.serving():
            return
        status = {
            "phase": "Running",
            "podIP": kubelet.ip,
            "podIPs": [{"ip": kubelet.ip}],
            "hostIP": "127.0.0.1",
            "startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "conditions": [
                _condition("PodScheduled", True),
                _condition("Initialized", True),
                _condition("ContainersReady", True),
                _condition("Ready", True),
            ],
        }
        self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )
        self._serving.add(uid)


class MultiNodeCluster:
    """etcd, kube-apiserver, kube-scheduler, kube-controller-manager and ``nodes`` fake Nodes.

    Attributes after `start`: ``server`` (the `LocalApiServer`), ``nodes`` (Node names
    ``node-0`` ...), ``api`` (a kubernetes ``ApiClient`` as the admin), ``kubelet``.

    Args:
        nodes: how many fake Nodes (zones ``zone-a``, ``zone-b``, ... one per node).
        ready_pods: whether the fake kubelet reports bound Pods Ready (no container runs).

    Raises (from `start`):
        BinariesNotFoundError: kube-scheduler or kube-controller-manager is not built
            (``hack/build-k8s-binaries.sh`` builds them).
        StartupError: a process exited or did not become ready in time (its log tail).
    """

    def __init__(self, nodes: int = 3, *, ready_pods: bool = False) -> None:
        self.node_count = nodes
        self.ready_pods = ready_pods
        self.server = LocalApiServer()
        self.nodes: list[str] = []
        self._processes: list[_Process] = []
        self.api: client.ApiClient | None = None
        self.kubelet: FakeKubelet | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start everything; on any error stop what was started and raise."""
        self.server.start()
        try:
            self._start_components()
            self.api = config.new_client_from_config(str(self.server.kubeconfig_path))
            self._make_nodes()
            self.kubelet = FakeKubelet(self.api, ready_pods=self.ready_pods, server=self.server)
            self.kubelet.start()
            self._wait_scheduler_sees_nodes()
            self._wait_controllers_run()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the fake kubelet, the controllers, the scheduler, then the API server."""
        if self.kubelet is not None:
            self.kubelet.stop()
            self.kubelet = None
        for process in reversed(self._processes):
            process.stop(self.server.stop_grace_seconds)
        self._processes.clear()
        if self.api is not None:
            self.api.close()
            self.api = None
        self.server.stop()

    def log_path(self, component: str) -> Path:
        return self.server.work_dir / f"{component}.log"

    def logs(self, component: str) -> str:
        """The log of ``kube-scheduler`` or ``kube-controller-manager`` so far."""
        return self.log_path(component).read_text(errors="replace")

    def _start_components(self) -> None:
        bin_dir = self.server.bin_dir
        kubeconfig = str(self.server.kubeconfig_path)
        for name in ("kube-scheduler", "kube-controller-manager"):
            if not (bin_dir / name).is_file():
                raise ApiServerHarnessError(
                    f"{bin_dir} lacks {name}; run hack/build-k8s-binaries.sh"
                )
        common = [f"--kubeconfig={kubeconfig}", "--leader-elect=false", "--secure-port=0", "--v=2"]
        scheduler = [str(bin_dir / "kube-scheduler"), *common]
        controllers = [
            str(bin_dir / "kube-controller-manager"),
            *common,
            f"--controllers={','.join(CONTROLLERS)}",
            "--use-service-account-credentials=false",
            # The attach-detach controller's safety net against missed events; the tests do not
            # rely on it, so a short period only costs CPU.
            "--attach-detach-reconcile-sync-period=5s",
        ]
        for argv in (scheduler, controllers):
            name = Path(argv[0]).name
            self._processes.append(_Process(name, argv, self.log_path(name)))

    def _make_nodes(self) -> None:
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        for index in range(self.node_count):
            name = f"{NODE_PREFIX}{index}"
            zone = f"zone-{chr(ord('a') + index)}"
            core.create_node(node_manifest(name, zone))
            core.patch_node_status(name, {"status": node_status()})
            # The API server's TaintNodesByCondition admission taints a new Node not-ready; the
            # node-lifecycle controller (off here) would lift the taint once the Node is Ready.
            core.patch_node(name, {"spec": {"taints": None}})
            self.nodes.append(name)

    def _wait_scheduler_sees_nodes(self, timeout: float = 60.0) -> None:
        """Wait until the scheduler binds a probe Pod (it has synced its caches)."""
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "scheduler-probe", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "none"}]},
        }
        core.create_namespaced_pod("default", probe)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self._processes:
                if not process.running():
                    raise process.failure("exited")
            if core.read_namespaced_pod("scheduler-probe", "default").spec.node_name:
                core.delete_namespaced_pod("scheduler-probe", "default", grace_period_seconds=0)
                return
            time.sleep(0.2)
        raise StartupError(
            f"kube-scheduler bound no Pod within {timeout:g}s:\n"
            f"{self.logs('kube-scheduler')[-3000:]}"
        )

    def _wait_controllers_run(self, timeout: float = 60.0) -> None:
        """Wait until the volume binder binds a probe claim (the controllers have started)."""
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        volume = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "controllers-probe"},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": {"path": "/nonexistent"},
            },
        }
        core.create_persistent_volume(volume)
        core.create_namespaced_persistent_volume_claim(
            "default", claim("controllers-probe", "controllers-probe", "ReadWriteOnce", "1Mi")
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self._processes:
                if not process.running():
                    raise process.failure("exited")
            found = core.read_namespaced_persistent_volume_claim("controllers-probe", "default")
            if found.status.phase == "Bound":
                core.delete_namespaced_persistent_volume_claim("controllers-probe", "default")
                core.delete_persistent_volume("controllers-probe")
                return
            time.sleep(0.2)
        raise StartupError(
            f"kube-controller-manager bound no claim within {timeout:g}s:\n"
            f"{self.logs('kube-controller-manager')[-3000:]}"
        )

    # -- helpers for tests -----------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = False) -> Any:
        """``kubectl`` as the admin (see `LocalApiServer.kubectl`)."""
        return self.server.kubectl(*args, input=input, check=check)

    def apply(self, manifests: Sequence[dict[str, Any]], namespace: str | None = None) -> None:
        """``kubectl apply`` ``manifests`` (in ``namespace`` when given); raise on failure."""
        ns = ["-n", namespace] if namespace else []
        document = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(manifests)})
        self.kubectl(*ns, "apply", "-f", "-", input=document, check=True)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """The Pods of ``namespace`` (matching the label ``selector``) as dicts."""
        args = ["-n", namespace, "get", "pods", "-o", "json"]
        if selector:
            args += ["-l", selector]
        return list(json.loads(self.kubectl(*args, check=True).stdout)["items"])

    def volume_attachments(self) -> list[dict[str, Any]]:
        """Every VolumeAttachment (the attach-detach controller's decisions)."""
        result = self.kubectl("get", "volumeattachments", "-o", "json", check=True)
        return list(json.loads(result.stdout)["items"])

    def wait(self, probe: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``probe`` every 0.2 s until truthy; raise AssertionError with ``what`` and the
        last value after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = probe()
            if last:
                return last
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def attachable_volume(
    name: str, handle: str, access_mode: str, reserved_for: tuple[str, str], size: str = "1Gi"
) -> list[dict[str, Any]]:
    """A CSI PersistentVolume of :data:`CSI_DRIVER` reserved for ``reserved_for`` (namespace,
    claim name), and the CSIDriver (``attachRequired``)."""
    driver = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": CSI_DRIVER},
        "spec": {"attachRequired": True, "podInfoOnMount": False},
    }
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": [access_mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": {"driver": CSI_DRIVER, "volumeHandle": handle},
            "claimRef": {"namespace": reserved_for[0], "name": reserved_for[1]},
        },
    }
    return [driver, volume]


def claim(name: str, volume: str, access_mode: str, size: str = "1Gi") -> dict[str, Any]:
    """A PersistentVolumeClaim bound by name to PersistentVolume ``volume``."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": [access_mode],
            "resources": {"requests": {"storage": size}},
            "storageClassName": "",
            "volumeName": volume,
        },
    }

"""A host-directory volume provisioner for the single-node e2e cluster (tier 3).

The operator's pod executor asks for scratch PersistentVolumeClaims without naming a storage
class, so the cluster needs a default StorageClass with a dynamic provisioner, as kind has
(local-path-provisioner). kube-controller-manager's own ``--enable-hostpath-provisioner`` makes
its directories 0750 root-owned, which the non-root workspace Pods cannot write (``fsGroup`` does
not apply to hostPath), and it always uses /tmp/hostpath_pv. This process does the same job as
local-path-provisioner without a helper image: for every Pending claim of ``--storage-class`` it
makes a world-writable directory under ``--root`` and a hostPath PersistentVolume bound to the
claim; a Released volume of its own has its directory removed and is deleted.

Runs on the node as root with the admin kubeconfig (started and stopped by ``e2e/cluster``).
Polls once a second: a handful of claims, no watch bookkeeping needed.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

PROVISIONER = "sandbox-e2e.local/hostpath"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
LOG = logging.getLogger("local-provisioner")


def _provision(core: client.CoreV1Api, claim: Any, root: Path) -> None:
    name = f"pvc-{claim.metadata.uid}"
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)  # any pod UID may write, as with local-path-provisioner
    storage = (claim.spec.resources.requests or {}).get("storage", "1Gi")
    volume: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": storage},
            "accessModes": claim.spec.access_modes or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": claim.spec.storage_class_name,
            "volumeMode": claim.spec.volume_mode or "Filesystem",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": claim.metadata.namespace,
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            },
        },
    }
    try:
        core.create_persistent_volume(volume)  # type: ignore[arg-type]  # dicts are accepted
        LOG.info("provisioned %s for %s/%s", name, claim.metadata.namespace, claim.metadata.name)
    except ApiException as exc:
        if exc.status != 409:
            raise


def _reclaim(core: client.CoreV1Api, volume: Any, root: Path) -> None:
    path = Path(volume.spec.host_path.path)
    # Never remove anything outside our own root, whatever the object says.
    if path.parent == root and path.name == volume.metadata.name:
        shutil.rmtree(path, ignore_errors=True)
    try:
        core.delete_persistent_volume(volume.metadata.name)
        LOG.info("deleted %s and %s", volume.metadata.name, path)
    except ApiException as exc:
        if exc.status != 404:
            raise


def run_once(core: client.CoreV1Api, storage_class: str, root: Path) -> None:
    """One reconcile pass over all claims and volumes."""
    claims: list[Any] = core.list_persistent_volume_claim_for_all_namespaces().items
    volumes: list[Any] = core.list_persistent_volume().items
    for claim in claims:
        if (
            claim.status.phase == "Pending"
            and not claim.spec.volume_name
            and claim.spec.storage_class_name == storage_class
            and claim.metadata.deletion_timestamp is None
        ):
            _provision(core, claim, root)
    for volume in volumes:
        ours = (volume.metadata.annotations or {}).get(PROVISIONED_BY) == PROVISIONER
        if ours and volume.status.phase in ("Released", "Failed") and volume.spec.host_path:
            _reclaim(core, volume, root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--storage-class", default="standard")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.root.mkdir(parents=True, exist_ok=True)
    config.load_kube_config(args.kubeconfig)  # type: ignore[no-untyped-call]
    core = client.CoreV1Api()
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        try:
            run_once(core, args.storage_class, args.root.resolve())
        except Exception:  # keep serving: the API server may be restarting
            LOG.exception("reconcile pass failed")
        time.sleep(1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

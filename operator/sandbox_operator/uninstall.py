"""The chart's pre-delete hook: delete every custom object while the operator still runs.

Case 19: ``helm uninstall`` removes the operator; a Sandbox left behind keeps
its finalizer ``sandbox.cleveragents.io/cleanup`` for good, and ``kubectl delete namespace``
then hangs in Terminating. The chart runs this module as a ``helm.sh/hook: pre-delete`` Job
(``python -m sandbox_operator.uninstall``), before Helm deletes anything: it deletes the
PlanCommits, then the Checkpoints, then the Sandboxes (in every namespace, or the watched
one), and waits until their finalizers have run and they are gone. When they are not gone
within the timeout the Job fails, Helm stops the uninstall, and the operator keeps running:
nothing is stranded (docs/operations.md, "Uninstall").

Exit codes: 0 every object gone; 1 objects left after the timeout (they are listed);
2 usage or API errors.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from sandbox_api.models import (
    CHECKPOINT_PLURAL,
    GROUP,
    PLANCOMMIT_PLURAL,
    SANDBOX_PLURAL,
    VERSION,
)
from sandbox_operator.kube import api as k8s

logger = logging.getLogger("sandbox_operator.uninstall")

ORDER = (PLANCOMMIT_PLURAL, CHECKPOINT_PLURAL, SANDBOX_PLURAL)
"""PlanCommits first (a cleanupPolicy Delete finalizer deletes Sandboxes), Sandboxes last
(a Checkpoint's snapshot lives in its Sandbox's repository or state)."""


def list_objects(custom: CustomObjectsApi, plural: str, namespace: str) -> list[dict[str, Any]]:
    """Objects of ``plural`` in ``namespace`` ("" = all namespaces; "a,b" = in each of those,
    the chart's watched namespaces)."""
    if "," in namespace:
        return [
            item
            for one in namespace.split(",")
            if one.strip()
            for item in list_objects(custom, plural, one.strip())
        ]
    if namespace:
        found = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    else:
        found = custom.list_cluster_custom_object(GROUP, VERSION, plural)
    return list(cast(dict[str, Any], found).get("items") or [])


def _label(item: dict[str, Any], plural: str) -> str:
    metadata = item["metadata"]
    return f"{plural}/{metadata.get('namespace')}/{metadata['name']}"


def delete_all(
    custom: CustomObjectsApi,
    namespace: str = "",
    timeout_seconds: float = 300.0,
    poll_seconds: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Delete every Sandbox, Checkpoint and PlanCommit (kind by kind, in :data:`ORDER`) and
    wait for each kind to be gone before the next one.

    Returns:
        ``plural/namespace/name`` of the objects still present at the timeout (empty: done).
    """
    deadline = clock() + timeout_seconds
    for plural in ORDER:
        for item in list_objects(custom, plural, namespace):
            metadata = item["metadata"]
            try:
                custom.delete_namespaced_custom_object(
                    GROUP, VERSION, metadata["namespace"], plural, metadata["name"]
                )
                logger.info("deleting %s", _label(item, plural))
            except ApiException as exc:
                if exc.status != 404:
                    raise
        while True:
            left = [_label(i, plural) for i in list_objects(custom, plural, namespace)]
            if not left:
                break
            if clock() >= deadline:
                return left + [
                    _label(i, later)
                    for later in ORDER[ORDER.index(plural) + 1 :]
                    for i in list_objects(custom, later, namespace)
                ]
            time.sleep(poll_seconds)
    return []


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sandbox_operator.uninstall [--namespace NS[,NS...]] [--timeout-seconds N]``."""
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_operator.uninstall",
        description="Delete every sandbox custom object and wait for the operator's finalizers.",
    )
    parser.add_argument(
        "--namespace", default="", help="only these namespaces, comma-separated (default: all)"
    )
    parser.add_argument("--timeout-seconds", type=float, default=300.0)
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        k8s.load_config()
        left = delete_all(k8s.Api().custom, args.namespace, args.timeout_seconds, args.poll_seconds)
    except ApiException as exc:
        logger.exception("API error: %s %s", exc.status, exc.reason)
        return 2
    if left:
        logger.error(
            "%d objects still present after %.0fs (is the operator running?): %s",
            len(left),
            args.timeout_seconds,
            ", ".join(left),
        )
        return 1
    logger.info("every Sandbox, Checkpoint and PlanCommit is gone")
    return 0


if __name__ == "__main__":
    sys.exit(main())

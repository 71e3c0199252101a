"""Keeping the warm pools full: every ``settings.warm_pool_interval_seconds`` the leader calls
:meth:`~sandbox_operator.executors.warm_pool.WarmPool.reconcile` for each pool namespace
(``settings.pool_namespaces``) and pool key: the chart's default workspace shape
(``workspace.*``) over each ReadWriteMany claim of ``settings.warm_pool_source_claims`` that
exists in the namespace. There is no pool without a claim: every Sandbox has a source, and one
that is not such a claim (a Secret, a ReadWriteOnce claim) never takes a pool Pod.

It is a loop started by the startup handler once the operator leads (``main.configure``), not a
kopf timer: kopf timers run per watched object, and a pool has no object of its own (a timer on
Namespaces would make kopf put its finalizer on them). A failed round is logged and the next
one tries again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandbox_operator.executors.placement import shared_across_nodes
from sandbox_operator.executors.warm_pool import WarmPool
from sandbox_operator.kube.api import Api
from sandbox_operator.resources.targets import workspace_defaults
from sandbox_operator.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolKey:
    """One pool: a namespace, the workspace shape and the source claim (``""``: none)."""

    namespace: str
    workspace: dict[str, Any]
    claim: str = ""


class PoolKeeper:
    """Refills the warm pools of the pool namespaces (see the module docstring).

    Args:
        settings: the pool's size, namespaces and source claims.
        api: the Kubernetes API (the claims' access modes).
        pool: the pool (the pod executor's).
    """

    def __init__(self, settings: Settings, api: Api, pool: WarmPool) -> None:
        self.settings = settings
        self.api = api
        self.pool = pool

    def keys(self) -> list[PoolKey]:
        """The pools to keep now: per namespace, the default shape over each listed source
        claim that exists there and is ReadWriteMany (one that does not is skipped with a log
        line: its Sandboxes keep Pods of their own).

        Raises:
            ApiException: reading a claim failed (other than 404).
        """
        workspace = workspace_defaults(self.settings).model_dump(by_alias=True, exclude_none=True)
        keys: list[PoolKey] = []
        for namespace in self.settings.pool_namespaces:
            for claim in self.settings.warm_pool_source_claims:
                try:
                    found = self.api.core.read_namespaced_persistent_volume_claim(claim, namespace)
                except ApiException as exc:
                    if exc.status == 404:
                        continue
                    raise
                modes = list(
                    (found.status.access_modes if found.status else None)
                    or (found.spec.access_modes if found.spec else None)
                    or []
                )
                if not shared_across_nodes(modes):
                    logger.info(
                        "warm pool: claim %s/%s is not ReadWriteMany (%s); its Sandboxes get "
                        "Pods of their own",
                        namespace,
                        claim,
                        ",".join(modes) or "no access modes",
                    )
                    continue
                keys.append(PoolKey(namespace, workspace, claim))
        return keys

    def refill(self) -> int:
        """One round: reconcile every pool; returns how many Pods were created. A pool whose
        reconcile fails is logged and skipped (the next round tries again)."""
        created = 0
        for key in self.keys():
            try:
                report = self.pool.reconcile(
                    key.namespace, self.settings.warm_pool_size, key.workspace, claim=key.claim
                )
            except ApiException as exc:
                logger.warning(
                    "warm pool %s%s: refill failed: HTTP %s %s",
                    key.namespace,
                    f" over claim {key.claim}" if key.claim else "",
                    exc.status,
                    exc.reason,
                )
                continue
            created += len(report.created)
            if report.replaced:
                logger.info(
                    "warm pool %s: replaced %d bad Pods", key.namespace, len(report.replaced)
                )
        return created


async def keep_pools(keeper: PoolKeeper, interval_seconds: float) -> None:
    """Refill every ``interval_seconds`` until cancelled (the operator stops)."""
    while True:
        try:
            await asyncio.to_thread(keeper.refill)
        except Exception:  # a round's failure never ends the loop
            logger.exception("warm pool: refill round failed")
        await asyncio.sleep(interval_seconds)

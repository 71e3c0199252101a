"""The creator of a PlanCommit stamped at admission (docs/approvals.md): with the chart's
MutatingAdmissionPolicy every PlanCommit names the user who created it, whatever the request
said, and the approval policy then keeps that user from approving it. Real API server, users
impersonated with ``kubectl --as``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.approvals import (
    CREATED_BY,
    add_approval,
    create_as,
    created_by,
    entry,
    grant_plancommit_rights,
    install_approval_policy,
    install_creator_policy,
)
from tests.support.operator import Cluster, plancommit_manifest

pytestmark = pytest.mark.slow

DIGEST = "sha256:" + "d" * 64


@pytest.fixture(scope="module")
def cluster(local_apiserver: Any) -> Iterator[Cluster]:
    cluster = Cluster.fresh(local_apiserver, prefix="nac")
    grant_plancommit_rights(cluster)
    creator = install_creator_policy(local_apiserver, cluster, "nac")
    approvals = install_approval_policy(local_apiserver, cluster, "nac")
    yield cluster
    for manifest in (approvals, creator):
        local_apiserver.kubectl("delete", "-f", "-", input=manifest, check=False)


def _creator(cluster: Cluster, name: str) -> str:
    body = cluster.get("plancommit", name) or {}
    return str((body["metadata"].get("annotations") or {}).get(CREATED_BY))


def test_every_plancommit_names_its_creator(cluster: Cluster) -> None:
    plain = plancommit_manifest("plain", "p", approval="Required")
    assert create_as(cluster, "carol", plain).returncode == 0
    assert _creator(cluster, "plain") == "carol"
    # A name the request makes up is replaced by the authenticated one.
    claimed = created_by(plancommit_manifest("claimed", "p", approval="Required"), "alice")
    assert create_as(cluster, "carol", claimed).returncode == 0
    assert _creator(cluster, "claimed") == "carol"


def test_the_stamped_creator_cannot_approve(cluster: Cluster) -> None:
    assert (
        create_as(
            cluster, "carol", plancommit_manifest("mine", "p", approval="Required")
        ).returncode
        == 0
    )
    refused = add_approval(cluster, "mine", "carol", entry("carol", DIGEST))
    assert refused.returncode != 0
    assert "the creator of a PlanCommit cannot approve" in refused.stderr
    allowed = add_approval(cluster, "mine", "alice", entry("alice", DIGEST))
    assert allowed.returncode == 0, allowed.stderr

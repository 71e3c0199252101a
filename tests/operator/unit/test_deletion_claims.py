"""The claims registry (module ``deletion``, case 17): a finalizer waits while a handler uses the
object; once finalizing began, no handler may act on it again."""

from __future__ import annotations

import threading

import pytest
from sandbox_operator.kube.claims import BeingDeletedError, Claims, deletion_began


def test_a_finalizer_waits_for_holders_and_then_no_new_claim_is_granted() -> None:
    claims = Claims()
    assert claims.acquire("u1", "PlanCommit ns/pc")
    assert claims.begin_finalizing("u1") == ["PlanCommit ns/pc"]  # waits
    assert not claims.is_finalizing("u1")
    claims.release("u1", "PlanCommit ns/pc")
    assert claims.begin_finalizing("u1") == []  # goes
    assert claims.begin_finalizing("u1") == []  # idempotent for a retried finalizer
    assert not claims.acquire("u1", "Checkpoint ns/c")
    refused = pytest.raises(BeingDeletedError, match="sandbox s1 is being deleted")
    with refused, claims.holding("u1", "Checkpoint ns/c", "sandbox s1"):
        pass
    assert claims.holders("u1") == []


def test_holding_releases_on_error_and_other_objects_are_independent() -> None:
    claims = Claims()
    with pytest.raises(RuntimeError), claims.holding("u1", "a", "x"):
        assert claims.holders("u1") == ["a"]
        raise RuntimeError
    assert claims.holders("u1") == []
    assert claims.begin_finalizing("u2") == []
    assert claims.acquire("u1", "a")


def test_concurrent_claims_and_finalizing_never_overlap() -> None:
    """Whatever the interleaving, an object is never held and finalizing at once."""
    claims = Claims()
    overlaps: list[str] = []
    barrier = threading.Barrier(9)

    def user(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            if claims.acquire("u", f"h{i}"):
                if claims.is_finalizing("u"):
                    overlaps.append(f"h{i}")
                claims.release("u", f"h{i}")

    def finalizer() -> None:
        barrier.wait()
        while claims.begin_finalizing("u"):
            pass

    threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=finalizer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == []
    assert claims.is_finalizing("u") and not claims.acquire("u", "late")


def test_deletion_began() -> None:
    assert deletion_began(None)
    assert deletion_began({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    assert not deletion_began({"metadata": {"name": "x"}})

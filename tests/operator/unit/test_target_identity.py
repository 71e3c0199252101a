"""The digest people approve names the targets (docs/approvals.md, "What the digest binds"):
another claim, sub-path, directory or Sandbox object gives another digest; the same target and
changes give the same one at review and at prepare."""

from __future__ import annotations

from pathlib import Path

from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.resources.target_identity import BoundHandle, bind_digest, target_identity

from sandbox_api.models import PvcSource, SandboxSource, SecretSource
from sandbox_core.protocol import ChangeSummary, PreparedCommit

DIGEST = "sha256:" + "c" * 64


def target(source: SandboxSource, uid: str = "uid-1") -> SandboxTarget:
    return SandboxTarget(
        name="sb",
        namespace="ns",
        uid=uid,
        sandbox_id="01SB",
        plan_id="p",
        resource_id="r",
        strategy="copy_on_write",
        original="/mnt/source",
        source=source,
    )


def claim(sub_path: str = "") -> SandboxSource:
    return SandboxSource(persistent_volume_claim=PvcSource(claim_name="data", sub_path=sub_path))


def test_a_claim_made_again_under_the_same_name_is_another_target() -> None:
    first = target_identity(target(claim("a/b")), claim_uid="claim-uid-1")
    again = target_identity(target(claim("a/./b/")), claim_uid="claim-uid-1")
    other = target_identity(target(claim("a/b")), claim_uid="claim-uid-2")
    assert first == again
    assert first != other
    assert bind_digest(first, DIGEST) != bind_digest(other, DIGEST)
    assert first.splitlines() == ["sandbox=ns/sb/uid-1", "claim=ns/data/claim-uid-1", "subPath=a/b"]


def test_a_directory_replaced_at_the_same_path_is_another_target(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    source = SandboxSource(node_path=str(tmp_path / "data"))
    before = target_identity(target(source), node_stat=(tmp_path / "data").stat())
    (tmp_path / "data").rename(tmp_path / "old")
    (tmp_path / "data").mkdir()
    after = target_identity(target(source), node_stat=(tmp_path / "data").stat())
    assert before != after
    assert before.splitlines()[1] == after.splitlines()[1] == f"nodePath={tmp_path / 'data'}"


def test_the_sandbox_object_and_the_secret_are_part_of_it() -> None:
    secret = SandboxSource(secret_ref=SecretSource(name="db", key="dsn"))
    assert target_identity(target(secret)) != target_identity(target(secret, uid="uid-2"))
    assert target_identity(target(secret)).splitlines()[-1] == "secret=ns/db/dsn"


class Participant:
    """A participant answering review and prepare with one change digest (a real dataclass
    reply, as the core's strategies give)."""

    def __init__(self, identity: str | None = None) -> None:
        self.identity = identity

    def review(self) -> ChangeSummary:
        return ChangeSummary(sandbox_id="01SB", resource_id="r", strategy="s", digest=DIGEST)

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit:
        return PreparedCommit(sandbox_id="01SB", txid=txid, digest=DIGEST)


class DatabaseParticipant(Participant):
    def target_identity(self) -> str:
        return f"database=system-id-{self.identity}/app"


def test_review_and_prepare_bind_the_same_identity() -> None:
    identities = iter(["claim=a", "claim=a", "claim=b"])
    handle = BoundHandle(Participant(), lambda: next(identities))
    reviewed = handle.review().digest
    assert reviewed == handle.prepare("tx").digest == bind_digest("claim=a", DIGEST)
    assert handle.prepare("tx").digest != reviewed  # the target changed identity in between


def test_a_participant_adds_its_own_identity() -> None:
    one = BoundHandle(DatabaseParticipant("1"), lambda: "secret=ns/db/dsn").review().digest
    two = BoundHandle(DatabaseParticipant("2"), lambda: "secret=ns/db/dsn").review().digest
    assert one != two
    assert one == bind_digest("secret=ns/db/dsn\ndatabase=system-id-1/app", DIGEST)

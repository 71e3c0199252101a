"""``status.coreRecord`` versioning (docs/api-evolution.md, issue 11 §3): a newer operator reads
an older record, refuses a newer one, and no record carries a password."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
from sandbox_operator.executors.base import sandbox_id_for_uid
from sandbox_operator.executors.local import LocalExecutor
from sandbox_operator.resources.sandbox import status_of_state
from sandbox_operator.resources.targets import target_from_body
from sandbox_operator.settings import Settings

from sandbox_api import core_record
from sandbox_core import SandboxStatus
from tests.support.gitrepo import GIT_ENV, git, make_repo

UID = "0b6c44a1-5d7e-4c1f-8f52-7c3a9e2d1b00"


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in GIT_ENV.items():
        monkeypatch.setenv(key, value)


def body(repo: Path, record: dict | None = None) -> dict:
    return {
        "apiVersion": "sandbox.cleveragents.io/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": "s1", "namespace": "ns", "uid": UID, "generation": 1},
        "spec": {
            "planId": "p",
            "resourceId": "repo",
            "strategy": "git_worktree",
            "source": {"nodePath": str(repo)},
        },
        "status": {"coreRecord": record} if record is not None else {},
    }


def test_a_version_0_record_reopens_the_sandbox_in_a_new_operator(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "v1\n"})
    old = LocalExecutor(Settings(state_dir=tmp_path / "old", sandbox_root=tmp_path / "sbx"))
    state = old.provision(target_from_body(body(repo), old.settings, None))
    # What the previous operator wrote into the status: the bare core record, no version.
    written_before = dict(state.record)
    assert core_record.SCHEMA_VERSION_KEY not in written_before
    (Path(state.sandbox_path) / "f.txt").write_text("v2\n")

    # A new operator with an empty state directory reads only the object.
    new = LocalExecutor(Settings(state_dir=tmp_path / "new", sandbox_root=tmp_path / "sbx"))
    target = target_from_body(body(repo, written_before), new.settings, None)
    assert target.core_record is not None and target.core_record["sandbox_id"] == state.sandbox_id
    handle = new.open(target)
    assert handle.status is SandboxStatus.ACTIVE
    assert handle.commit("from an old record").success
    assert (repo / "f.txt").read_text() == "v2\n"
    assert "from an old record" in git(repo, "log", "-1", "--format=%s")


def test_the_operator_writes_the_current_version_and_reads_it_back(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "v1\n"})
    executor = LocalExecutor(Settings(state_dir=tmp_path / "s", sandbox_root=tmp_path / "sbx"))
    state = executor.provision(target_from_body(body(repo), executor.settings, None))
    status = status_of_state(state, "local", None, 1)
    assert status["coreRecord"]["schemaVersion"] == core_record.CURRENT_SCHEMA_VERSION == 1
    target = target_from_body(body(repo, status["coreRecord"]), executor.settings, None)
    assert target.core_record == {**state.record, "original_path": str(repo)} | {
        "context": {**state.record["context"], "original_path": str(repo)}
    }
    assert target.sandbox_id == sandbox_id_for_uid(UID)


def test_a_newer_record_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"f.txt": "v1\n"})
    settings = Settings(state_dir=tmp_path / "s", sandbox_root=tmp_path / "sbx")
    with pytest.raises(kopf.PermanentError, match="schemaVersion 2 is newer than this operator"):
        target_from_body(body(repo, {"schemaVersion": 2, "strategy": "x"}), settings, None)
    with pytest.raises(core_record.CoreRecordVersionError):
        core_record.decode({"schemaVersion": "one"})


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        (
            "postgresql://app:s3cret@db:5432/app",
            "user=app password=*** dbname=app host=db port=5432",
        ),
        ("host=db user=app password=s3cret dbname=app", "user=app password=*** dbname=app host=db"),
        ("host=db password='a b' dbname=app", "password=*** dbname=app host=db"),
        ("/var/lib/app/data.db", "/var/lib/app/data.db"),
    ],
)
def test_no_password_is_written_and_the_real_original_is_read_back(dsn: str, shown: str) -> None:
    record = {"strategy": "transaction_rollback", "original_path": dsn,
              "context": {"original_path": dsn, "sandbox_path": "x"}}  # fmt: skip
    written = core_record.encode(record)
    assert written is not None
    assert written["original_path"] == shown == written["context"]["original_path"]
    assert "s3cret" not in str(written) and "'a b'" not in str(written)
    read = core_record.decode(written, dsn)
    assert read is not None
    assert read["original_path"] == dsn == read["context"]["original_path"]

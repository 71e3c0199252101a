"""A fork across workspace agents (docs/forks.md, "Forks in workspace Pods"): one real agent
exports a checkpoint as a tar, the stream is piped unread into another real agent's import,
which starts the fork from it; the parent's agent may be gone by then. The import trusts
nothing in the stream: traversal, links leading out, devices, FIFOs, a bundle of another
checkpoint and one past the bound are refused, and nothing of them is kept."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_operator.executors.agent_client import AgentClient, AgentRefused

from sandbox_core.agent import bundle, wire
from sandbox_core.errors import SandboxForkError
from tests.support.agent import AgentProcess
from tests.support.gitrepo import git, make_repo

PARENT_ID = "01HZX0A7Q3J0F8K2M4N6P8R0T2"
FORK_ID = "01HZX0A7Q3J0F8K2M4N6P8R0T3"


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[tuple[AgentProcess, AgentProcess]]:
    started = []
    for name in ("parent", "fork"):
        work = tmp_path / name
        work.mkdir()
        started.append(AgentProcess(work).start())
    yield started[0], started[1]
    for agent in started:
        agent.stop()


def create(client: AgentClient, original: Path, strategy: str, sid: str, **extra: str) -> dict:
    body = {
        "plan_id": "plan-f", "resource_id": "res", "strategy": strategy,
        "original": str(original), "sandbox_id": sid, **extra,
    }  # fmt: skip
    return client.call("POST", wire.CREATE.template, body, request_id=f"create-{sid}-{len(extra)}")


def write(client: AgentClient, sid: str, rel: str, text: str) -> None:
    rid = f"w-{abs(hash((rel, text)))}"
    client.call("PUT", wire.WRITE.path(sid=sid), text.encode(), query={"path": rel}, request_id=rid)


def read(client: AgentClient, sid: str, rel: str) -> str:
    reply = client.call("GET", wire.FILE_TEXT.path(sid=sid), query={"path": rel})
    return str(reply["content"])


def checkpoint(client: AgentClient, sid: str) -> str:
    reply = client.call(
        "POST", wire.CHECKPOINT.path(sid=sid), {"phase": "explore"}, request_id="ckpt-1"
    )
    return str(reply["checkpoint_id"])


def carry(parent: AgentClient, fork: AgentClient, cid: str, max_bytes: int = 0) -> dict:
    """What the operator does: the export's stream, unread, as the import's body."""
    query = {wire.MAX_BYTES_QUERY: str(max_bytes)} if max_bytes else None
    with parent.stream("GET", wire.EXPORT.path(cid=cid), query=query) as source:
        assert source.headers["Content-Type"] == wire.TAR_CONTENT_TYPE
        length = int(source.headers["Content-Length"])
        return fork.call(
            "PUT", wire.IMPORT.path(cid=cid), source, request_id=f"import-{cid}", length=length
        )


def test_a_copy_on_write_fork_starts_in_another_agent_after_its_parent_is_gone(
    agents: tuple[AgentProcess, AgentProcess], tmp_path: Path
) -> None:
    parent_agent, fork_agent = agents
    original = tmp_path / "original"
    (original / "conf").mkdir(parents=True)
    (original / "conf" / "a.ini").write_text("retries = 1\n")
    (original / "keep.txt").write_text("kept\n")
    parent, fork = parent_agent.client(), fork_agent.client()
    create(parent, original, "copy_on_write", PARENT_ID)
    write(parent, PARENT_ID, "conf/a.ini", "retries = 3\n")
    write(parent, PARENT_ID, "new/tool.sh", "#!/bin/sh\necho hi\n")
    cid = checkpoint(parent, PARENT_ID)
    write(parent, PARENT_ID, "conf/a.ini", "retries = 9\n")  # after the checkpoint: not carried

    imported = carry(parent, fork, cid)
    assert imported["checkpoint_id"] == cid
    assert imported["kind"] == "directory"
    assert imported["bytes"] > 0
    parent_agent.stop()  # the fork never needs its parent again

    made = create(fork, original, "copy_on_write", FORK_ID, fork_checkpoint=cid)
    assert made["status"] == "created"
    assert read(fork, FORK_ID, "conf/a.ini") == "retries = 3\n"
    assert read(fork, FORK_ID, "new/tool.sh") == "#!/bin/sh\necho hi\n"
    assert read(fork, FORK_ID, "keep.txt") == "kept\n"
    assert (original / "conf" / "a.ini").read_text() == "retries = 1\n"
    diff = fork.call("GET", wire.DIFF.path(sid=FORK_ID))["diff"]
    assert "+retries = 3" in diff
    assert "new/tool.sh" in diff
    # The import is dropped once the fork holds its own copy; no export is left either.
    assert not (fork_agent.work / "state" / "imports" / cid).exists()
    assert list((parent_agent.work / "state" / "exports").iterdir()) == []


def test_a_git_fork_carries_only_the_checkpoint_facts_and_starts_from_its_commit(
    agents: tuple[AgentProcess, AgentProcess], tmp_path: Path
) -> None:
    parent_agent, fork_agent = agents
    repo = make_repo(tmp_path / "repo", {"f.txt": "base\n"})
    parent, fork = parent_agent.client(), fork_agent.client()
    create(parent, repo, "git_worktree", PARENT_ID)
    write(parent, PARENT_ID, "f.txt", "parent's change\n")
    cid = checkpoint(parent, PARENT_ID)
    imported = carry(parent, fork, cid)
    assert imported["kind"] == "git_ref"
    assert imported["files"] == 1  # fork.json alone: the commit is in the shared repository
    create(fork, repo, "git_worktree", FORK_ID, fork_checkpoint=cid)
    assert read(fork, FORK_ID, "f.txt") == "parent's change\n"
    assert git(repo, "show", "HEAD:f.txt") == "base"


def test_an_overlay_fork_in_fallback_mode_is_carried_with_its_layer(
    agents: tuple[AgentProcess, AgentProcess], tmp_path: Path
) -> None:
    parent_agent, fork_agent = agents
    original = tmp_path / "layer"
    original.mkdir()
    (original / "h.txt").write_text("o0\n")
    (original / "gone.txt").write_text("to be deleted\n")
    parent, fork = parent_agent.client(), fork_agent.client()
    fallback = {"mode": "fallback"}
    body = {
        "plan_id": "plan-f", "resource_id": "res", "strategy": "overlay",
        "original": str(original), "sandbox_id": PARENT_ID, "options": fallback,
    }  # fmt: skip
    parent.call("POST", wire.CREATE.template, body, request_id="create-overlay-parent")
    write(parent, PARENT_ID, "h.txt", "o1\n")
    parent.call(
        "POST", wire.FILE_DELETE.path(sid=PARENT_ID), {"path": "gone.txt"}, request_id="del-1"
    )
    cid = checkpoint(parent, PARENT_ID)
    assert carry(parent, fork, cid)["kind"] == "overlay_snapshot"
    body = {**body, "sandbox_id": FORK_ID, "fork_checkpoint": cid}
    fork.call("POST", wire.CREATE.template, body, request_id="create-overlay-fork")
    assert read(fork, FORK_ID, "h.txt") == "o1\n"
    listing = fork.call("GET", wire.LIST.path(sid=FORK_ID), query={"path": "."})["entries"]
    assert [entry["name"] for entry in listing] == ["h.txt"]
    assert (original / "gone.txt").exists()


def test_an_export_or_import_past_the_bound_is_refused_and_keeps_nothing(
    agents: tuple[AgentProcess, AgentProcess], tmp_path: Path
) -> None:
    parent_agent, fork_agent = agents
    original = tmp_path / "original"
    original.mkdir()
    parent, fork = parent_agent.client(), fork_agent.client()
    create(parent, original, "copy_on_write", PARENT_ID)
    write(parent, PARENT_ID, "big.bin", "x" * 200_000)
    cid = checkpoint(parent, PARENT_ID)
    with pytest.raises(AgentRefused) as refused:
        parent.call("GET", wire.EXPORT.path(cid=cid), query={wire.MAX_BYTES_QUERY: "100000"})
    assert refused.value.error_type == "SandboxForkError"
    assert "larger than 100000 bytes" in refused.value.detail
    with parent.stream("GET", wire.EXPORT.path(cid=cid)) as source:
        length = int(source.headers["Content-Length"])
        with pytest.raises(AgentRefused) as too_large:
            fork.call(
                "PUT", wire.IMPORT.path(cid=cid), source, query={wire.MAX_BYTES_QUERY: "100000"},
                request_id="import-big", length=length,
            )  # fmt: skip
    assert too_large.value.error_type == "PayloadTooLarge"
    state = fork_agent.work / "state"
    assert not (state / "imports" / cid).exists()
    assert list((state / "spool").iterdir()) == []


# -- what an import refuses -----------------------------------------------------------------------


def member(name: str, data: bytes = b"", **fields: object) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data


FACTS = {
    "format": 1, "sandbox_id": PARENT_ID, "checkpoint_id": "01CKPT", "kind": "directory",
    "commit": "", "parent_metadata": {}, "snapshot": True, "baseline": False,
}  # fmt: skip


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = member("fork.json", json.dumps(FACTS).encode())
        tar.addfile(info, io.BytesIO(data))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


HOSTILE = {
    "traversal": [member("snapshot/../../escaped", b"x")],
    "absolute": [member("/tmp/escaped", b"x")],
    "outside the layout": [member("elsewhere/f", b"x")],
    "symlink out": [member("snapshot/out", type=tarfile.SYMTYPE, linkname="../../../../etc")],
    "absolute symlink": [member("snapshot/abs", type=tarfile.SYMTYPE, linkname="/etc/passwd")],
    "through a symlink": [
        member("snapshot/up", type=tarfile.SYMTYPE, linkname=".."),
        member("snapshot/up/fork.json", b"{}"),
    ],
    "hard link out": [member("snapshot/hard", type=tarfile.LNKTYPE, linkname="../../etc/passwd")],
    "device": [member("snapshot/null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)],
    "fifo": [member("snapshot/pipe", type=tarfile.FIFOTYPE)],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_unpack_refuses_a_hostile_member_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    data = tar_of(*HOSTILE[case])
    path = tmp_path / "bundle.tar"
    path.write_bytes(data)
    dest = tmp_path / "imports" / "01CKPT"
    with pytest.raises(SandboxForkError, match="refused"):
        bundle.unpack(path, dest)
    assert not dest.exists()
    assert not dest.with_name("01CKPT.partial").exists()
    assert not (tmp_path / "escaped").exists()


def test_unpack_keeps_modes_but_drops_setuid_and_owners(tmp_path: Path) -> None:
    path = tmp_path / "bundle.tar"
    path.write_bytes(
        tar_of(
            member("snapshot", type=tarfile.DIRTYPE, mode=0o750),
            member("snapshot/run.sh", b"#!/bin/sh\n", mode=0o4777, uid=4242, gid=4242),
            member("snapshot/link", type=tarfile.SYMTYPE, linkname="run.sh"),
        )
    )
    facts = bundle.unpack(path, tmp_path / "out")
    assert facts["checkpoint_id"] == "01CKPT"
    script = tmp_path / "out" / "snapshot" / "run.sh"
    assert script.stat().st_mode & 0o7777 == 0o777
    assert script.stat().st_uid == os.getuid()
    assert os.readlink(tmp_path / "out" / "snapshot" / "link") == "run.sh"
    source = bundle.fork_source_of(tmp_path / "out")
    assert source.snapshot_path == str(tmp_path / "out" / "snapshot")
    assert source.baseline_path == ""


def test_the_import_route_refuses_a_hostile_bundle_or_another_checkpoints(
    agents: tuple[AgentProcess, AgentProcess],
) -> None:
    _, fork_agent = agents
    fork = fork_agent.client()
    hostile = tar_of(member("snapshot/../../../escaped", b"x"))
    with pytest.raises(AgentRefused) as refused:
        fork.call(
            "PUT", wire.IMPORT.path(cid="01CKPT"), io.BytesIO(hostile), request_id="import-h",
            length=len(hostile),
        )  # fmt: skip
    assert refused.value.error_type == "SandboxForkError"
    other = tar_of()
    with pytest.raises(AgentRefused, match="is of checkpoint 01CKPT"):
        fork.call(
            "PUT", wire.IMPORT.path(cid="01OTHER"), io.BytesIO(other), request_id="import-o",
            length=len(other),
        )  # fmt: skip
    imports = fork_agent.work / "state" / "imports"
    assert sorted(p.name for p in imports.iterdir()) == []
    assert not (fork_agent.work / "escaped").exists()

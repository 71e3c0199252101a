"""The two-phase overlap check for operator plans (issue 9), without a cluster: the identity
of a Sandbox's original across workspace Pods (volume + sub-path), and the coordinator's check
of prepared writes by that identity for executor handles (whose own paths are the same mount
path in every Pod)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.resources.plan_sources import source_root

from sandbox_api.models import SandboxSource
from sandbox_core.plan.two_phase import overlapping_writes
from sandbox_core.protocol import ChangeSummary, PreparedCommit


def target(
    source: dict[str, object], strategy: str = "copy_on_write", ns: str = "ns"
) -> SandboxTarget:
    return SandboxTarget(
        name="s", namespace=ns, uid="u", sandbox_id="id", plan_id="p", resource_id="r",
        strategy=strategy, original="/workspace/original",
        source=SandboxSource.model_validate(source),
    )  # fmt: skip


def pvc(claim: str, sub: str = "", ns: str = "ns", strategy: str = "copy_on_write") -> str | None:
    source = {"persistentVolumeClaim": {"claimName": claim, "subPath": sub}}
    return source_root(target(source, strategy, ns))


def test_pvc_sources_name_the_claim_and_a_normalised_sub_path() -> None:
    assert pvc("data") == "pvc:ns/data"
    assert pvc("data", "a/./b//") == pvc("data", "/a/b") == "pvc:ns/data/a/b"
    assert pvc("data", "../../etc") == "pvc:ns/data/etc"  # never above the claim's root
    assert pvc("data", "..") == "pvc:ns/data"
    assert pvc("data", ns="other") != pvc("data")  # claims are namespaced
    assert pvc("data", strategy="overlay") == "pvc:ns/data"
    assert pvc("data", strategy="git_worktree") is None  # git merges: its own conflict check


def test_node_paths_are_compared_by_their_real_path(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "link")
    assert source_root(target({"nodePath": str(tmp_path / "link")})) == (
        f"node:{tmp_path / 'real'}"
    )


def handle(sid: str, root: str | None) -> SimpleNamespace:
    return SimpleNamespace(sandbox_id=sid, strategy="copy_on_write",
                           original_path="/workspace/original", source_root=root)  # fmt: skip


def prepared(sid: str, *paths: str) -> PreparedCommit:
    summary = ChangeSummary(sandbox_id=sid, resource_id=sid, strategy="copy_on_write",
                            digest="sha256:0", changed=list(paths))  # fmt: skip
    return PreparedCommit(sandbox_id=sid, txid="tpc.p.0.1", digest="sha256:0", summary=summary)


@pytest.mark.parametrize(
    ("first", "second", "paths", "clash"),
    [
        (("data", ""), ("data", ""), (["f.txt"], ["f.txt"]), ["f.txt"]),
        (("data", ""), ("data", "sub"), (["sub/f.txt"], ["f.txt"]), ["f.txt"]),
        (("data", "sub"), ("data", ""), (["f.txt"], ["sub"]), ["sub"]),  # replaces the folder
        (("data", ""), ("data", ""), (["f.txt"], ["g.txt"]), None),  # disjoint paths
        (("data", ""), ("other", ""), (["f.txt"], ["f.txt"]), None),  # different volumes
        (("data", "a"), ("data", "ab"), (["f.txt"], ["f.txt"]), None),  # siblings, not nested
    ],
)
def test_executor_handles_clash_by_volume_and_sub_path(
    first: tuple[str, str], second: tuple[str, str], paths: tuple[list[str], list[str]],
    clash: list[str] | None,
) -> None:  # fmt: skip
    handles = [handle("a", pvc(*first)), handle("b", pvc(*second))]
    found = overlapping_writes(handles, [prepared("a", *paths[0]), prepared("b", *paths[1])])
    assert found == (None if clash is None else (2, clash, 1))


def test_executor_handles_without_a_source_root_are_not_compared() -> None:
    handles = [handle("a", None), handle("b", None)]
    found = overlapping_writes(handles, [prepared("a", "f.txt"), prepared("b", "f.txt")])
    assert found is None

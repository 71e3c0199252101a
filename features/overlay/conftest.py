"""Step definitions for the overlay area (seed 003 verbatim, plus overlay_kernel.feature).

Every seed 003 scenario that starts from "an ovl test directory is initialised" runs twice: on a
real kernel OverlayFS mount and on the userspace fallback (fixture ``ovl_mode``). Faults are
injected only by patching (``unittest.mock``) while the step under test runs, so fixture
teardown always cleans up with the real functions. Every mount is undone at teardown, even when
a scenario fails, and the teardown asserts that none is left under the test's tmp_path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pytest_bdd import given, parsers, then, when
from pytest_bdd.scenario import scenario_wrapper_template_registry
from ulid import ULID

from sandbox_core.errors import (
    SandboxCommitError,
    SandboxCreationError,
    SandboxRollbackError,
    SandboxStateError,
)
from sandbox_core.status import SandboxStatus
from sandbox_core.strategies.overlay import OverlaySandbox
from sandbox_core.strategies.overlay import mount as _overlay_mount
from sandbox_core.tree import sync


def overlay_mounts_under(root: Path) -> list[str]:
    """Mount points of overlay filesystems at or below ``root`` (this mount namespace)."""
    prefix = os.path.realpath(root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        point = head.split()[4].replace("\\040", " ")
        if tail.startswith("overlay ") and (point == prefix or point.startswith(prefix + "/")):
            found.append(point)
    return found


@pytest.fixture
def ovl(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Scenario state; at teardown cleans every sandbox and proves no mount is left."""
    state: dict[str, Any] = {"sandboxes": [], "faults": [], "tmp": tmp_path}
    yield state
    for sandbox in state["sandboxes"]:
        with contextlib.suppress(Exception):
            sandbox.cleanup()
    leftovers = overlay_mounts_under(tmp_path)
    for point in leftovers:
        _overlay_mount.unmount(Path(point))
    assert leftovers == [], f"mounts left behind: {leftovers}"


SEED_MODE_STEP = "an ovl test directory is initialised"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every scenario that starts from ``SEED_MODE_STEP`` in kernel and fallback mode."""
    template = scenario_wrapper_template_registry.get(metafunc.function)
    if template is None or "ovl_mode" not in metafunc.fixturenames:
        return
    if any(step.name == SEED_MODE_STEP for step in template.steps):
        modes = [pytest.param("kernel", marks=pytest.mark.overlay_kernel), "fallback"]
        metafunc.parametrize("ovl_mode", modes, indirect=True)


@pytest.fixture
def ovl_mode(request: pytest.FixtureRequest) -> str:
    """The overlay mode a scenario runs in (``auto`` unless parametrised above)."""
    return str(getattr(request, "param", "auto"))


def _new_sandbox(ovl: dict[str, Any], path: Path | str, **options: Any) -> OverlaySandbox:
    options.setdefault("mode", ovl.get("mode", "auto"))
    sandbox = OverlaySandbox("res-ovl", str(path), sandbox_root=str(ovl["tmp"] / "root"), **options)
    ovl["sandboxes"].append(sandbox)
    ovl["sandbox"] = sandbox
    return sandbox


@contextlib.contextmanager
def _faults(ovl: dict[str, Any]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for target in ovl["faults"]:
            stack.enter_context(mock.patch(target, side_effect=OSError(errno.EIO, "injected")))
        yield


def _attempt(ovl: dict[str, Any], action: Any, *args: Any) -> Any:
    ovl["error"] = None
    try:
        with _faults(ovl):
            return action(*args)
    except Exception as exc:
        ovl["error"] = exc
        return None


# -- Given ------------------------------------------------------------------------------------


@given("an ovl test directory is initialised")
def ovl_test_directory(ovl: dict[str, Any], ovl_mode: str) -> None:
    src = ovl["tmp"] / "src"
    (src / "data").mkdir(parents=True)
    (src / "existing.txt").write_text("original content")
    (src / "data" / "file.txt").write_text("data")
    ovl["src"] = src
    ovl["mode"] = ovl_mode


@given("an ovl non-existent directory")
def ovl_missing_directory(ovl: dict[str, Any]) -> None:
    ovl["missing"] = ovl["tmp"] / "does-not-exist"


@given("an ovl sandbox with merged_dir forced to None")
def ovl_merged_dir_none(ovl: dict[str, Any]) -> None:
    """A created sandbox whose private ``_merged_dir`` is cleared, as the seed describes."""
    src = ovl["tmp"] / "src"
    src.mkdir()
    sandbox = _new_sandbox(ovl, src)
    sandbox.create("plan-none")
    sandbox._merged_dir = None


@given(parsers.parse('an ovl sandbox is created and activated for plan "{plan_id}"'))
def ovl_created_and_activated(ovl: dict[str, Any], plan_id: str) -> None:
    """Activation is the actor's first write through get_path, so the commit has a file to copy."""
    sandbox = _new_sandbox(ovl, ovl["src"])
    sandbox.create(plan_id)
    Path(sandbox.get_path("activated.txt")).write_text("written by the actor")


@given("ovl shutil.copy2 is patched to raise OSError")
def ovl_patch_copy2(ovl: dict[str, Any]) -> None:
    """Both modes stage a commit's files with the exact file copy that replaced shutil.copy2
    (``_fs_utils.copy_file``: keeps holes; copy2 would fill them), so the fault goes there."""
    ovl["faults"].append("sandbox_core.tree.copy.copy_file")


@given("ovl shutil.rmtree is patched to raise OSError for rollback")
def ovl_patch_rmtree(ovl: dict[str, Any]) -> None:
    """Kernel mode empties the upper layer, fallback the merged copy, both with shutil.rmtree."""
    ovl["faults"].append("shutil.rmtree")


@given("ovl shutil.copytree is patched to raise OSError")
def ovl_patch_copytree(ovl: dict[str, Any]) -> None:
    """The seed names the fallback's create-time copy; a kernel mount copies nothing, so this
    scenario forces the userspace fallback in both parametrisations. The copy is now the exact
    ``cp -a`` of ``backup_directory`` (copytree dropped sockets and owners: cases 10, 36)."""
    ovl["faults"].append("sandbox_core.tree.baseline.backup_directory")
    ovl["mode"] = "fallback"


# -- When -------------------------------------------------------------------------------------


@when(parsers.parse('an ovl sandbox is created for plan "{plan_id}"'))
def ovl_create(ovl: dict[str, Any], plan_id: str) -> None:
    _new_sandbox(ovl, ovl["src"]).create(plan_id)


@when("an ovl sandbox is created with empty plan_id")
def ovl_create_empty_plan(ovl: dict[str, Any]) -> None:
    _attempt(ovl, _new_sandbox(ovl, ovl["src"]).create, "")


@when("an ovl sandbox is prepared with empty resource_id")
def ovl_prepare_empty_resource(ovl: dict[str, Any]) -> None:
    _attempt(ovl, OverlaySandbox, "", str(ovl["src"]))


@when("an ovl sandbox is prepared with empty original_path")
def ovl_prepare_empty_original(ovl: dict[str, Any]) -> None:
    _attempt(ovl, OverlaySandbox, "res-ovl", "")


@when(parsers.parse('an ovl sandbox is created on the non-existent directory for plan "{plan_id}"'))
def ovl_create_missing(ovl: dict[str, Any], plan_id: str) -> None:
    _attempt(ovl, _new_sandbox(ovl, ovl["missing"]).create, plan_id)


@when(parsers.parse('the ovl path "{path}" is resolved'))
def ovl_resolve(ovl: dict[str, Any], path: str) -> None:
    ovl["resolved"] = _attempt(ovl, ovl["sandbox"].get_path, path)


@when(parsers.parse('the ovl path "{path}" is resolved on a cleaned-up sandbox'))
def ovl_resolve_cleaned(ovl: dict[str, Any], path: str) -> None:
    _attempt(ovl, ovl["sandbox"].get_path, path)


@when("the ovl sandbox is cleaned up")
@when("the ovl sandbox is cleaned up again")
def ovl_cleanup(ovl: dict[str, Any]) -> None:
    ovl["sandbox"].cleanup()


@when("the ovl sandbox is committed")
def ovl_commit(ovl: dict[str, Any]) -> None:
    ovl["result"] = ovl["sandbox"].commit()


@when(parsers.parse('the ovl sandbox is committed with message "{message}"'))
def ovl_commit_message(ovl: dict[str, Any], message: str) -> None:
    ovl["result"] = ovl["sandbox"].commit(message)


@when(parsers.parse('an ovl file "{name}" is created in the sandbox with content "{content}"'))
@when(
    parsers.parse(
        'the ovl existing file "{name}" is modified in the sandbox with content "{content}"'
    )
)
def ovl_write(ovl: dict[str, Any], name: str, content: str) -> None:
    Path(ovl["sandbox"].get_path(name)).write_text(content)


@when(parsers.parse('the ovl existing file "{name}" is deleted from the sandbox'))
def ovl_delete(ovl: dict[str, Any], name: str) -> None:
    Path(ovl["sandbox"].get_path(name)).unlink()


@when("the ovl sandbox commit is attempted on cleaned-up sandbox")
@when("the ovl sandbox commit is attempted")
def ovl_commit_attempt(ovl: dict[str, Any]) -> None:
    ovl["result"] = _attempt(ovl, ovl["sandbox"].commit)


@when("the ovl sandbox is rolled back")
@when("the ovl sandbox is rolled back from committed")
def ovl_rollback(ovl: dict[str, Any]) -> None:
    ovl["sandbox"].rollback()


@when("the ovl sandbox rollback is attempted on created sandbox")
@when("the ovl sandbox rollback is attempted")
def ovl_rollback_attempt(ovl: dict[str, Any]) -> None:
    _attempt(ovl, ovl["sandbox"].rollback)


@when("an ovl sandbox is instantiated")
def ovl_instantiate(ovl: dict[str, Any]) -> None:
    _new_sandbox(ovl, ovl["src"])


@when(parsers.parse('ovl get_path is called with "{path}" expecting an error'))
def ovl_get_path_error(ovl: dict[str, Any], path: str) -> None:
    _attempt(ovl, ovl["sandbox"].get_path, path)


@when(parsers.parse('an ovl sandbox create is attempted for plan "{plan_id}"'))
def ovl_create_attempt(ovl: dict[str, Any], plan_id: str) -> None:
    _attempt(ovl, _new_sandbox(ovl, ovl["src"]).create, plan_id)


# -- Then -------------------------------------------------------------------------------------


@then(parsers.parse('the ovl sandbox should be in the "{status}" state'))
def ovl_status(ovl: dict[str, Any], status: str) -> None:
    assert ovl["sandbox"].status == SandboxStatus(status)


@then(parsers.parse('the ovl sandbox context should reference plan "{plan_id}"'))
def ovl_context_plan(ovl: dict[str, Any], plan_id: str) -> None:
    assert ovl["sandbox"].context.plan_id == plan_id


@then(parsers.parse('the ovl sandbox context should have strategy metadata "{strategy}"'))
def ovl_context_strategy(ovl: dict[str, Any], strategy: str) -> None:
    metadata = ovl["sandbox"].context.metadata
    assert metadata["strategy"] == strategy
    assert metadata["overlay_mode"] == ovl["mode"]


@then("the ovl sandbox merged path should exist")
def ovl_merged_exists(ovl: dict[str, Any]) -> None:
    merged = Path(ovl["sandbox"].context.sandbox_path)
    assert merged.is_dir()
    assert (merged / "existing.txt").read_text() == "original content"


@then(parsers.parse('an ovl ValueError should be raised with message "{message}"'))
def ovl_value_error(ovl: dict[str, Any], message: str) -> None:
    assert isinstance(ovl["error"], ValueError)
    assert str(ovl["error"]) == message


@then("an ovl SandboxCreationError should be raised")
def ovl_creation_error(ovl: dict[str, Any]) -> None:
    assert isinstance(ovl["error"], SandboxCreationError)


@then("the ovl sandbox should have upper, work, and merged directories")
def ovl_layout(ovl: dict[str, Any]) -> None:
    sandbox = ovl["sandbox"]
    base = ovl["tmp"] / "root" / "overlay" / sandbox.sandbox_id
    for name in ("upper", "work", "merged"):
        assert (base / name).is_dir(), name
    assert sandbox.context.metadata["merged_dir"] == str(base / "merged")


@then("the ovl resolved path should be inside the merged directory")
def ovl_resolved_inside(ovl: dict[str, Any]) -> None:
    merged = ovl["sandbox"].merged_dir
    assert Path(ovl["resolved"]) == merged / "data" / "file.txt"


@then("an ovl SandboxStateError should be raised")
def ovl_state_error(ovl: dict[str, Any]) -> None:
    assert isinstance(ovl["error"], SandboxStateError)


@then(parsers.parse('an ovl SandboxStateError should be raised with message "{message}"'))
def ovl_state_error_message(ovl: dict[str, Any], message: str) -> None:
    assert isinstance(ovl["error"], SandboxStateError)
    assert str(ovl["error"]) == message


@then("the ovl commit result should indicate success")
def ovl_commit_success(ovl: dict[str, Any]) -> None:
    assert ovl["result"].success is True
    assert ovl["result"].error is None


@then(parsers.parse("the ovl commit result should have {count:d} {kind} files"))
def ovl_commit_count(ovl: dict[str, Any], count: int, kind: str) -> None:
    assert len(getattr(ovl["result"], f"{kind}_files")) == count


@then(
    parsers.parse(
        'the ovl file "{name}" should exist in the original directory with content "{content}"'
    )
)
@then(parsers.parse('the ovl file "{name}" in the original should have content "{content}"'))
@then(parsers.parse('the ovl original file "{name}" should contain "{content}"'))
def ovl_original_content(ovl: dict[str, Any], name: str, content: str) -> None:
    assert (ovl["src"] / name).read_text() == content


@then(parsers.parse('the ovl file "{name}" should not exist in the original directory'))
def ovl_original_missing(ovl: dict[str, Any], name: str) -> None:
    assert not (ovl["src"] / name).exists()


@then(parsers.parse('the ovl file "{name}" should not exist in the sandbox'))
@then(parsers.parse('the ovl merged directory should not contain stale file "{name}"'))
def ovl_sandbox_missing(ovl: dict[str, Any], name: str) -> None:
    merged = ovl["sandbox"].merged_dir
    assert merged.is_dir()
    assert not (merged / name).exists()
    assert (merged / "existing.txt").read_text() == "original content"


@then("the ovl sandbox base path should not exist")
def ovl_base_gone(ovl: dict[str, Any]) -> None:
    assert not (ovl["tmp"] / "root" / "overlay" / ovl["sandbox"].sandbox_id).exists()
    assert overlay_mounts_under(ovl["tmp"]) == []


@then("the ovl sandbox_id should be a valid ULID")
def ovl_ulid(ovl: dict[str, Any]) -> None:
    sandbox_id = ovl["sandbox"].sandbox_id
    assert len(sandbox_id) == 26
    assert str(ULID.from_str(sandbox_id)) == sandbox_id


@then(parsers.parse('the ovl sandbox status should be "{status}"'))
def ovl_status_value(ovl: dict[str, Any], status: str) -> None:
    assert ovl["sandbox"].status.value == status


@then("the ovl sandbox context should be None")
def ovl_context_none(ovl: dict[str, Any]) -> None:
    assert ovl["sandbox"].context is None


@then("the ovl sandbox should use userspace fallback")
def ovl_uses_fallback(ovl: dict[str, Any]) -> None:
    """Forces OverlayFS to be unavailable: mount(2) fails with EPERM, as in a pod without
    CAP_SYS_ADMIN. A sandbox for the same plan in mode "auto" must then fall back to the
    userspace copy and say why."""
    unavailable = PermissionError(errno.EPERM, "Operation not permitted")
    with mock.patch.object(_overlay_mount, "mount_overlay", side_effect=unavailable):
        sandbox = _new_sandbox(ovl, ovl["src"], mode="auto")
        context = sandbox.create("plan-fallback")
    assert context.metadata["overlay_mode"] == "fallback"
    assert "Operation not permitted" in context.metadata["fallback_reason"]
    assert (Path(context.sandbox_path) / "existing.txt").read_text() == "original content"
    assert overlay_mounts_under(ovl["tmp"] / "root" / "overlay" / sandbox.sandbox_id) == []


@then(parsers.parse('the ovl commit metadata should contain message "{message}"'))
def ovl_commit_message_metadata(ovl: dict[str, Any], message: str) -> None:
    assert ovl["result"].metadata["message"] == message
    assert ovl["result"].metadata["strategy"] == "overlay"


@then("an ovl SandboxCommitError should be raised")
def ovl_commit_error(ovl: dict[str, Any]) -> None:
    assert isinstance(ovl["error"], SandboxCommitError)
    # A failed commit leaves the original exactly as it was.
    assert sorted(p.name for p in ovl["src"].iterdir()) == ["data", "existing.txt"]
    assert (ovl["src"] / "existing.txt").read_text() == "original content"


@then("an ovl SandboxRollbackError should be raised")
def ovl_rollback_error(ovl: dict[str, Any]) -> None:
    assert isinstance(ovl["error"], SandboxRollbackError)


# -- overlay_kernel.feature -------------------------------------------------------------------


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Snapshot of a tree: relative path -> (file type bits, content or link target)."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            st = path.lstat()
            data = b""
            if stat.S_ISREG(st.st_mode):
                data = path.read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                data = os.fsencode(os.readlink(path))
            found[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), data)
    return found


@given(parsers.parse('an ovl kernel source directory with "{name}" containing "{content}"'))
def ovl_kernel_source(ovl: dict[str, Any], name: str, content: str) -> None:
    src = ovl["tmp"] / "src"
    src.mkdir()
    (src / name).write_text(content)
    ovl["src"] = src
    ovl["before"] = _tree(src)


@when(parsers.parse('an ovl kernel sandbox is created in mode "{mode}"'))
def ovl_kernel_create(ovl: dict[str, Any], mode: str) -> None:
    _new_sandbox(ovl, ovl["src"], mode=mode).create("plan-kernel")


@when(
    parsers.parse('an ovl kernel sandbox is created in mode "{mode}" while mount fails with EPERM')
)
def ovl_kernel_create_eperm(ovl: dict[str, Any], mode: str) -> None:
    unavailable = PermissionError(errno.EPERM, "Operation not permitted")
    with mock.patch.object(_overlay_mount, "mount_overlay", side_effect=unavailable):
        _attempt(ovl, _new_sandbox(ovl, ovl["src"], mode=mode).create, "plan-kernel")


@when(parsers.parse('the ovl kernel sandbox writes "{name}" with "{content}"'))
def ovl_kernel_write(ovl: dict[str, Any], name: str, content: str) -> None:
    Path(ovl["sandbox"].get_path(name)).write_text(content)


@when(parsers.parse('the ovl kernel sandbox deletes "{name}"'))
def ovl_kernel_delete(ovl: dict[str, Any], name: str) -> None:
    Path(ovl["sandbox"].get_path(name)).unlink()


@when("the ovl kernel sandbox is committed")
def ovl_kernel_commit(ovl: dict[str, Any]) -> None:
    ovl["result"] = ovl["sandbox"].commit("kernel commit")


@when("the ovl kernel commit is attempted while the second swap fails")
def ovl_kernel_commit_swap_fails(ovl: dict[str, Any]) -> None:
    """The second path swapped into the original fails; the first swap must be undone."""
    swapped: list[str] = []

    def fail_on_second_swap(path: str) -> None:
        swapped.append(path)
        if len(swapped) == 2:
            raise OSError(errno.EIO, "injected swap failure")

    with mock.patch.object(sync, "fault_hook", fail_on_second_swap):
        _attempt(ovl, ovl["sandbox"].commit)
    assert swapped == ["existing.txt", "notes.txt"]


@when("the ovl kernel sandbox is rolled back")
def ovl_kernel_rollback(ovl: dict[str, Any]) -> None:
    ovl["sandbox"].rollback()


@when("the ovl kernel sandbox is cleaned up")
def ovl_kernel_cleanup(ovl: dict[str, Any]) -> None:
    ovl["sandbox"].cleanup()


@then(parsers.parse('the ovl kernel sandbox uses overlay mode "{mode}"'))
def ovl_kernel_mode(ovl: dict[str, Any], mode: str) -> None:
    metadata = ovl["sandbox"].context.metadata
    assert metadata["overlay_mode"] == mode
    assert ("fallback_reason" in metadata) is (mode == "fallback")


@then(parsers.parse('the ovl kernel fallback reason mentions "{text}"'))
def ovl_kernel_reason(ovl: dict[str, Any], text: str) -> None:
    assert text in ovl["sandbox"].context.metadata["fallback_reason"]


@then("the ovl kernel merged directory is an overlay mount point")
def ovl_kernel_mounted(ovl: dict[str, Any]) -> None:
    assert overlay_mounts_under(ovl["sandbox"].base_path) == [
        os.path.realpath(ovl["sandbox"].merged_dir)
    ]


@then("the ovl kernel merged directory is not mounted")
def ovl_kernel_not_mounted(ovl: dict[str, Any]) -> None:
    assert overlay_mounts_under(ovl["tmp"]) == []


@then("the ovl kernel original is unchanged")
def ovl_kernel_original_unchanged(ovl: dict[str, Any]) -> None:
    assert _tree(ovl["src"]) == ovl["before"]


@then(parsers.parse('the ovl kernel upper layer holds a whiteout for "{name}"'))
def ovl_kernel_whiteout(ovl: dict[str, Any], name: str) -> None:
    st = (ovl["sandbox"].upper_dir / name).lstat()
    assert stat.S_ISCHR(st.st_mode)
    assert st.st_rdev == 0


@then("the ovl kernel upper layer is empty")
def ovl_kernel_upper_empty(ovl: dict[str, Any]) -> None:
    assert list(ovl["sandbox"].upper_dir.iterdir()) == []


@then(parsers.parse('the ovl kernel original file "{name}" contains "{content}"'))
def ovl_kernel_original_file(ovl: dict[str, Any], name: str, content: str) -> None:
    assert (ovl["src"] / name).read_text() == content
    assert (Path(ovl["sandbox"].merged_dir) / name).read_text() == content


@then("the ovl kernel original holds no overlay artefacts")
def ovl_kernel_no_artefacts(ovl: dict[str, Any]) -> None:
    for directory, dirs, files in os.walk(ovl["src"]):
        for name in dirs + files:
            path = os.path.join(directory, name)
            assert not stat.S_ISCHR(os.lstat(path).st_mode), path
            assert not name.startswith(".wh."), path
            assert not [x for x in os.listxattr(path, follow_symlinks=False) if ".overlay." in x]
    assert sorted(p.name for p in ovl["src"].iterdir()) == ["existing.txt", "notes.txt"]


@then(parsers.parse('the ovl kernel sandbox still shows "{name}" with "{content}"'))
def ovl_kernel_still_shows(ovl: dict[str, Any], name: str, content: str) -> None:
    sandbox = ovl["sandbox"]
    assert sandbox.status is SandboxStatus.ERRORED
    assert (sandbox.merged_dir / name).read_text() == content


@then("an ovl kernel SandboxCommitError is raised")
def ovl_kernel_commit_error(ovl: dict[str, Any]) -> None:
    assert isinstance(ovl["error"], SandboxCommitError)


@then("an ovl kernel SandboxCreationError is raised")
def ovl_kernel_creation_error(ovl: dict[str, Any]) -> None:
    assert isinstance(ovl["error"], SandboxCreationError)
    assert "Operation not permitted" in str(ovl["error"])


@then(parsers.parse('the ovl kernel sandbox status is "{status}"'))
def ovl_kernel_status(ovl: dict[str, Any], status: str) -> None:
    assert ovl["sandbox"].status.value == status


@then("the ovl kernel base path does not exist")
def ovl_kernel_base_gone(ovl: dict[str, Any]) -> None:
    assert not ovl["sandbox"].base_path.exists()

"""Step definitions of features/operator (real API server, operator subprocess, real repos)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_bdd import given, parsers, then, when

from tests.support.operator import (
    Cluster,
    OperatorProcess,
    checkpoint_manifest,
    git,
    make_dir,
    make_repo,
    plancommit_manifest,
    sandbox_manifest,
    wait_for,
)

TERMINAL = {"Committed", "RolledBack", "Failed"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every scenario here needs the API server (the feature's @apiserver tag)."""
    for item in items:
        if "features/operator" in str(item.path):
            item.add_marker(pytest.mark.apiserver)
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    """Paths and outcomes shared by the steps of one scenario."""
    return {"paths": {}, "tmp": tmp_path}


@given("a namespace on the local API server with the sandbox CRDs", target_fixture="cluster")
def _cluster(local_apiserver: Any) -> Cluster:
    return Cluster.fresh(local_apiserver, prefix="bdd")


@pytest.fixture
def operator_process(local_apiserver: Any, tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    holder: list[OperatorProcess] = []
    yield holder
    for process in holder:
        if process.process is not None and process.process.poll() is None:
            Cluster(local_apiserver, process.namespace).kubectl(
                "delete", "sandboxes,checkpoints", "--all", "--timeout=60s", check=False
            )
        process.stop()


@given("the operator runs with the local executor", target_fixture="operator")
def _operator(
    local_apiserver: Any,
    cluster: Cluster,
    tmp_path: Path,
    operator_process: list[OperatorProcess],
) -> OperatorProcess:
    work = tmp_path / "operator"
    work.mkdir()
    process = OperatorProcess(local_apiserver, cluster.namespace, work)
    operator_process.append(process)
    cluster.operator = process
    return process.start()


@given(parsers.parse('a git repository "{name}" with file "{file}" containing "{text}"'))
def _repo(world: dict[str, Any], name: str, file: str, text: str) -> None:
    world["paths"][name] = make_repo(world["tmp"] / name, {file: text + "\n"})


@given(parsers.parse('a directory "{name}" with file "{file}" containing "{text}"'))
def _dir(world: dict[str, Any], name: str, file: str, text: str) -> None:
    world["paths"][name] = make_dir(world["tmp"] / name, {file: text + "\n"})


def _path(world: dict[str, Any], name: str) -> Path:
    return Path(world["paths"].get(name, world["tmp"] / name))


@when(parsers.parse('I apply a "{strategy}" Sandbox "{name}" of plan "{plan}" over "{source}"'))
def _apply_sandbox(
    world: dict[str, Any], cluster: Cluster, strategy: str, name: str, plan: str, source: str
) -> None:
    world["applied"] = cluster.apply(sandbox_manifest(name, plan, strategy, _path(world, source)))


def _active(cluster: Cluster, name: str) -> dict[str, Any]:
    status = cluster.wait_phase("sandbox", name, {"Active", "Errored"})
    assert status["phase"] == "Active", status
    return status


@given(
    parsers.parse(
        'an Active "{strategy}" Sandbox "{name}" of plan "{plan}" over "{source}" '
        'where "{file}" is written as "{text}"'
    )
)
def _active_sandbox(
    world: dict[str, Any],
    cluster: Cluster,
    strategy: str,
    name: str,
    plan: str,
    source: str,
    file: str,
    text: str,
) -> None:
    cluster.create(sandbox_manifest(name, plan, strategy, _path(world, source)))
    status = _active(cluster, name)
    (Path(status["sandboxPath"]) / file).write_text(text + "\n")


@given(parsers.parse('"{repo}" file "{file}" is committed on the original as "{text}"'))
def _conflict(world: dict[str, Any], repo: str, file: str, text: str) -> None:
    (_path(world, repo) / file).write_text(text + "\n")
    git(_path(world, repo), "commit", "-qam", "original moved")


@given("the operator will be killed right after the first sandbox commit is journaled")
def _fault(operator: OperatorProcess) -> None:
    operator.stop()
    operator.start({"SANDBOX_CORE_FAULT": "after_record:1"})


@when(parsers.parse('I apply a PlanCommit "{name}" of plan "{plan}"'))
def _apply_plancommit(cluster: Cluster, name: str, plan: str) -> None:
    cluster.create(plancommit_manifest(name, plan))


@when(parsers.parse('I apply a Saga PlanCommit "{name}" of plan "{plan}"'))
def _apply_saga_plancommit(cluster: Cluster, name: str, plan: str) -> None:
    cluster.create(plancommit_manifest(name, plan, mode="Saga"))


@then(parsers.parse('PlanCommit "{name}" rolled back nothing'))
def _rolled_back_nothing(cluster: Cluster, name: str) -> None:
    status = cluster.status("pcommit", name)
    assert status["rolledBackIds"] == [] and status["mode"] == "TwoPhase", status
    assert cluster.condition("pcommit", name, "RolledBack")["reason"] == "Aborted"


@when("the operator dies and a new operator starts")
def _restart(operator: OperatorProcess) -> None:
    assert operator.wait_exit(90) != 0
    operator.start()


@when(parsers.parse('I delete Sandbox "{name}"'))
def _delete(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "sandbox", name, "--timeout=60s")


@when(parsers.parse('I apply a Checkpoint "{name}" of Sandbox "{sandbox}"'))
def _checkpoint(cluster: Cluster, name: str, sandbox: str) -> None:
    cluster.create(checkpoint_manifest(name, sandbox))


@when(parsers.parse('Checkpoint "{name}" becomes Ready'))
def _checkpoint_ready(cluster: Cluster, name: str) -> None:
    assert cluster.wait_phase("checkpoint", name, {"Ready", "Failed"})["phase"] == "Ready"


@when(parsers.parse('"{file}" is written as "{text}" in Sandbox "{name}"'))
def _write(cluster: Cluster, file: str, text: str, name: str) -> None:
    (Path(cluster.status("sandbox", name)["sandboxPath"]) / file).write_text(text + "\n")


@when(parsers.parse('I request restore "{rid}" of Sandbox "{name}" to Checkpoint "{checkpoint}"'))
def _restore(cluster: Cluster, rid: str, name: str, checkpoint: str) -> None:
    patch = f'{{"spec":{{"restoreRequest":{{"id":"{rid}","checkpointName":"{checkpoint}"}}}}}}'
    cluster.kubectl("patch", "sandbox", name, "--type=merge", "-p", patch)
    wait_for(lambda: cluster.status("sandbox", name).get("lastRestoreRequestId") == rid, 60)


@then(parsers.parse('Sandbox "{name}" becomes Active with Ready "{ready}"'))
def _is_active(cluster: Cluster, name: str, ready: str) -> None:
    _active(cluster, name)
    assert cluster.condition("sandbox", name, "Ready")["status"] == ready


@then(parsers.parse('the sandbox path of "{name}" holds file "{file}" containing "{text}"'))
def _sandbox_file(cluster: Cluster, name: str, file: str, text: str) -> None:
    path = Path(cluster.status("sandbox", name)["sandboxPath"]) / file
    assert path.read_text() == text + "\n"


@then(
    parsers.parse('PlanCommit "{name}" ends in phase "{phase}" with condition "{type_}" "{value}"')
)
def _plancommit_phase(cluster: Cluster, name: str, phase: str, type_: str, value: str) -> None:
    status = cluster.wait_phase("pcommit", name, TERMINAL)
    assert status["phase"] == phase, status
    assert cluster.condition("pcommit", name, type_)["status"] == value


@then(parsers.parse('PlanCommit "{name}" ends in a terminal phase'))
def _terminal(cluster: Cluster, name: str) -> None:
    cluster.wait_phase("pcommit", name, TERMINAL)


@then(parsers.parse('"{where}" file "{file}" contains "{text}"'))
def _original_file(world: dict[str, Any], where: str, file: str, text: str) -> None:
    assert (_path(world, where) / file).read_text() == text + "\n"


@then(parsers.parse('the "{type_}" condition of PlanCommit "{name}" names Sandbox "{sandbox}"'))
def _names(cluster: Cluster, type_: str, name: str, sandbox: str) -> None:
    message = cluster.condition("pcommit", name, type_)["message"]
    assert sandbox in message and cluster.status("sandbox", sandbox)["sandboxId"] in message


@then(parsers.parse('the rolled-back ids of PlanCommit "{name}" are the id of Sandbox "{sandbox}"'))
def _rolled_back(cluster: Cluster, name: str, sandbox: str) -> None:
    expected = [cluster.status("sandbox", sandbox)["sandboxId"]]
    assert cluster.status("pcommit", name)["rolledBackIds"] == expected


@then("either both originals hold the new content or neither does")
def _all_or_nothing(world: dict[str, Any]) -> None:
    changed = [
        (_path(world, "repo") / "f.txt").read_text() == "r1\n",
        (_path(world, "data") / "g.txt").read_text() == "d1\n",
    ]
    assert all(changed) or not any(changed), changed


@then(parsers.parse('Sandbox "{name}" is gone'))
def _gone(cluster: Cluster, name: str) -> None:
    wait_for(lambda: cluster.gone("sandbox", name), 60)


@then(parsers.parse('"{repo}" has only its main worktree and branch'))
def _clean_repo(world: dict[str, Any], repo: str) -> None:
    assert len(git(_path(world, repo), "worktree", "list").splitlines()) == 1
    assert git(_path(world, repo), "branch", "--list").strip() == "* main"


@then(parsers.parse('the API server refuses it with a message containing "{text}"'))
def _refused(world: dict[str, Any], text: str) -> None:
    assert world["applied"].returncode != 0
    assert text in world["applied"].stderr

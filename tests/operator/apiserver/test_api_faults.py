"""The operator's flows through an API fault proxy (issue 11, "Scale under faults").

tests/support/apiserver/fault_proxy.py sits between the operator and the real API server and
answers 10% of requests with 429, 500 or (creates and resourceVersion-guarded writes) 409, and
drops every watch stream after 0.5-3 s. The flows
of features/operator still end right: Sandboxes become Active, a PlanCommit commits every sandbox
of its plan, a PlanCommit whose commit fails compensates and leaves the originals as they were,
and deleted Sandboxes go with their artefacts. Kubectl in the test talks to the API server
directly: only the operator's traffic is faulted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.apiserver.fault_proxy import ApiFaultProxy
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    make_dir,
    plancommit_manifest,
    sandbox_manifest,
    three_sandbox_plan,
    wait_for,
)

pytestmark = pytest.mark.slow

TERMINAL = {"Committed", "RolledBack", "Failed"}


@pytest.fixture
def proxy(local_apiserver: Any) -> Iterator[ApiFaultProxy]:
    with ApiFaultProxy(local_apiserver, rate=0.1) as running:
        yield running
    print(dict(running.counts))


def test_operator_flows_end_right_under_api_faults(
    local_apiserver: Any,
    proxy: ApiFaultProxy,
    tmp_path: Path,
) -> None:
    cluster = Cluster.fresh(local_apiserver, "faults")
    work = tmp_path / "operator"
    work.mkdir()
    operator = OperatorProcess(
        proxy, cluster.namespace, work, {"SANDBOX_OPERATOR_FAULT_FAIL_COMMIT": "bad-2"}
    )
    cluster.operator = operator
    operator.start()
    try:
        # Flow 1: three strategies to Active, then one PlanCommit commits them all.
        plan = three_sandbox_plan(cluster, tmp_path, "plan-ok")
        cluster.create(plancommit_manifest("pc-ok", "plan-ok"))
        done = cluster.wait_phase("pcommit", "pc-ok", TERMINAL, timeout=180)
        assert done["phase"] == "Committed", done
        assert (plan["repo"] / "f.txt").read_text() == "r1\n"
        assert (plan["data"] / "g.txt").read_text() == "d1\n"
        assert (plan["layer"] / "h.txt").read_text() == "o1\n"

        # Flow 2: the second sandbox's commit fails, the first is compensated.
        sources = [make_dir(tmp_path / f"bad{i}", {"g.txt": "b0\n"}) for i in (1, 2)]
        for i, source in enumerate(sources, 1):
            cluster.create(sandbox_manifest(f"bad-{i}", "plan-bad", "copy_on_write", source))
        for i in (1, 2):
            status = cluster.wait_phase("sandbox", f"bad-{i}", {"Active", "Errored"}, 180)
            assert status["phase"] == "Active", status
            (Path(status["sandboxPath"]) / "g.txt").write_text("b1\n")
        cluster.create(plancommit_manifest("pc-bad", "plan-bad"))
        failed = cluster.wait_phase("pcommit", "pc-bad", TERMINAL, timeout=180)
        assert failed["phase"] != "Committed", failed
        assert failed["failedRollbackIds"] == []
        assert [(s / "g.txt").read_text() for s in sources] == ["b0\n", "b0\n"]

        # Flow 3: deletion runs the finalizers; the artefacts go, the originals stay.
        paths = [Path(cluster.status("sandbox", n)["sandboxPath"]) for n in ("sb-copy", "bad-1")]
        cluster.kubectl("delete", "sandboxes", "--all", "--wait=false")
        wait_for(
            lambda: not cluster.kubectl("get", "sandboxes", "-o", "name").stdout.strip(),
            180,
            "every Sandbox deleted",
        )
        assert not any(path.exists() for path in paths)
        assert (plan["data"] / "g.txt").read_text() == "d1\n"
    finally:
        # On failure too: the finalizers unmount the overlay sandbox before the operator stops.
        cluster.kubectl("delete", "sandboxes", "--all", "--timeout=120s", check=False)
        operator.stop()
        print(operator.logs()[-6000:])
    counts = proxy.counts
    for kind in ("429", "500", "409", "watch_dropped"):
        assert counts[kind] > 0, f"no {kind} injected: {dict(counts)}"

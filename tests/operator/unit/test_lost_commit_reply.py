"""A saga commit whose reply is lost is asked about, never compensated on a guess.

A security review found: on the saga path with the pod executor (the saga runs
whenever two phases are unavailable), a commit whose reply was lost or timed out was recorded as
failed and the other sandboxes were compensated, while the agent landed the commit: half a plan
landed and the PlanCommit said Failed.

Real parts: a workspace agent process on 127.0.0.1 (``sandbox-core serve-workspace``) serving
two copy_on_write sandboxes of real directories, the pod executor's handle
(:class:`RemoteSandbox`) over the real HTTP client, the core's saga with a file journal. The
fault is injected in the transport (the executor's ``call``): the agent receives and runs the
commit, then its reply is dropped (as a timeout or a broken connection would), or the agent
cannot be reached at all for a while.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.base import SandboxTarget
from sandbox_operator.executors.remote import RemoteSandbox

from sandbox_core.agent import wire
from sandbox_core.errors import CommitOutcomeUnknownError
from sandbox_core.plan.journal import FileCommitJournal, JournalPhase, JournalReason, StepState
from sandbox_core.plan.saga import PlanCommitSaga
from tests.support.agent import UID, AgentProcess

PLAN = "plan-lost"
IDS = ("01HZX0A7Q3J0F8K2M4N6P8R0A1", "01HZX0A7Q3J0F8K2M4N6P8R0B2")


class LossyTransport:
    """The pod executor's ``call`` straight to the agent process, with faults: the reply of the
    next commit of a sandbox in :attr:`lose_reply` is dropped after the agent sent it, and
    while :attr:`down` every call fails as an unreachable agent does."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.lose_reply: set[str] = set()
        self.down = False
        self.commits_sent: list[str] = []

    def call(
        self,
        target: SandboxTarget,
        method: str,
        path: str,
        body: dict[str, Any] | bytes | None = None,
        *,
        query: dict[str, str] | None = None,
        request_id: str = "",
    ) -> dict[str, Any]:
        if self.down:
            raise ExecutorError(f"agent {method} {path}: ConnectionRefusedError", retryable=True)
        reply = self.agent.client().call(method, path, body, query=query, request_id=request_id)
        if path == wire.COMMIT.path(sid=target.sandbox_id):
            self.commits_sent.append(target.sandbox_id)
            if target.sandbox_id in self.lose_reply:
                self.lose_reply.discard(target.sandbox_id)
                raise ExecutorError(f"agent {method} {path}: TimeoutError", retryable=True)
        return reply


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path).start()
    yield process
    process.stop()


def _plan(agent: AgentProcess, tmp_path: Path) -> tuple[LossyTransport, list[Path]]:
    """Two Active copy_on_write sandboxes in the agent, each with its edit of ``f``."""
    originals = []
    client = agent.client()
    for number, sandbox_id in enumerate(IDS):
        original = tmp_path / f"orig{number}"
        original.mkdir()
        (original / "f").write_text("v0\n")
        originals.append(original)
        body = {
            "plan_id": PLAN, "resource_id": f"r{number}", "strategy": "copy_on_write",
            "original": str(original), "sandbox_id": sandbox_id,
        }  # fmt: skip
        client.call("POST", "/v1/sandboxes", body, request_id=f"create-{sandbox_id}")
        client.call("POST", f"/v1/sandboxes/{sandbox_id}/activate", request_id=f"a-{sandbox_id}")
        client.call(
            "PUT", wire.WRITE.path(sid=sandbox_id), b"v1\n", query={wire.PATH_QUERY: "f"},
            request_id=f"w-{sandbox_id}",
        )  # fmt: skip
    return LossyTransport(agent), originals


def _handles(transport: LossyTransport) -> list[RemoteSandbox]:
    """Fresh pod handles (status read now), as the PlanCommit opens them."""
    handles = []
    for number, sandbox_id in enumerate(IDS):
        target = SandboxTarget(
            name=f"s{number}", namespace="ns", uid=UID, sandbox_id=sandbox_id, plan_id=PLAN,
            resource_id=f"r{number}", strategy="copy_on_write", original="",
        )  # fmt: skip
        reply = transport.call(target, "GET", wire.STATUS.path(sid=sandbox_id))
        handles.append(RemoteSandbox(transport, target, reply))  # type: ignore[arg-type]
    return handles


def _contents(originals: list[Path]) -> list[str]:
    return [(original / "f").read_text() for original in originals]


def test_a_lost_commit_reply_is_asked_about_and_the_plan_lands_whole(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """The second step's commit lands in the agent and its reply is lost: the saga asks the
    agent (the same request again, answered from its request journal) and records the step
    committed; nothing is compensated and the plan says Committed, truthfully."""
    transport, originals = _plan(agent, tmp_path)
    transport.lose_reply.add(IDS[1])
    journal = FileCommitJournal(tmp_path / "journal.json")
    results = PlanCommitSaga(journal).run(PLAN, _handles(transport))
    assert [r.success for r in results] == [True, True]
    assert _contents(originals) == ["v1\n", "v1\n"]
    state = journal.load()
    assert state is not None
    assert state.phase is JournalPhase.COMMITTED
    assert state.reason is JournalReason.COMMITTED
    assert state.rolled_back_ids == []
    assert [step.state for step in state.steps] == [StepState.COMMITTED, StepState.COMMITTED]
    # Asked with the same request: the agent replayed its stored reply, committing once.
    assert transport.commits_sent == [IDS[0], IDS[1], IDS[1]]
    statuses = [h.status.value for h in _handles(transport)]
    assert statuses == ["committed", "committed"]


def test_an_unreachable_agent_leaves_the_attempt_open_until_it_can_be_asked(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """The reply is lost and the agent stays unreachable while the saga asks: nothing is
    compensated (the first sandbox's commit stays), the attempt stays open with reason
    OutcomeUnknown, and recovery once the agent answers again ends it all committed."""
    transport, originals = _plan(agent, tmp_path)
    transport.lose_reply.add(IDS[1])
    journal = FileCommitJournal(tmp_path / "journal.json")
    handles = _handles(transport)
    real_commit = handles[1].commit

    def commit_then_unreachable(message: str | None = None) -> Any:
        try:
            return real_commit(message)
        finally:
            transport.down = True  # from now on the agent cannot be asked

    handles[1].commit = commit_then_unreachable  # type: ignore[method-assign]
    with pytest.raises(CommitOutcomeUnknownError):
        PlanCommitSaga(journal).run(PLAN, handles)
    assert _contents(originals) == ["v1\n", "v1\n"], "nothing was compensated on a guess"
    state = journal.load()
    assert state is not None
    assert state.phase is JournalPhase.COMMITTING
    assert state.reason is JournalReason.OUTCOME_UNKNOWN
    assert state.rolled_back_ids == [] and state.failed_rollback_ids == []
    assert [step.state for step in state.steps] == [StepState.COMMITTED, StepState.COMMITTING]

    # Recovery while the agent is still unreachable asks, gets no answer, and changes nothing.
    by_id = dict(zip(IDS, handles, strict=True))
    again = PlanCommitSaga(journal).recover(lambda step: by_id[step.sandbox_id])
    assert again is not None and again.phase is JournalPhase.COMMITTING
    assert again.reason is JournalReason.OUTCOME_UNKNOWN
    assert _contents(originals) == ["v1\n", "v1\n"]

    # The agent answers again: recovery learns that the commit landed; the plan is committed.
    transport.down = False
    fresh = dict(zip(IDS, _handles(transport), strict=True))
    done = PlanCommitSaga(journal).recover(lambda step: fresh[step.sandbox_id])
    assert done is not None
    assert done.phase is JournalPhase.COMMITTED, done
    assert done.rolled_back_ids == [] and done.failed_rollback_ids == []
    assert _contents(originals) == ["v1\n", "v1\n"]


def test_a_lost_reply_of_a_commit_that_did_not_land_fails_the_plan_whole(
    agent: AgentProcess, tmp_path: Path
) -> None:
    """The agent refused the second commit (a conflict) and that reply was lost: asked, the
    agent replays its refusal; the step failed, the first sandbox is compensated, and every
    original is back as it was (all or nothing, and the PlanCommit says Failed truthfully)."""
    transport, originals = _plan(agent, tmp_path)
    (originals[1] / "f").write_text("theirs\n")  # the original moved: the commit conflicts
    transport.lose_reply.add(IDS[1])
    real_call = transport.call

    def refusal_then_lost(target: SandboxTarget, method: str, path: str, *a: Any, **k: Any) -> Any:
        try:
            return real_call(target, method, path, *a, **k)
        except ExecutorError as exc:
            if not exc.retryable and target.sandbox_id in transport.lose_reply:
                transport.lose_reply.discard(target.sandbox_id)
                raise ExecutorError(f"agent {method} {path}: TimeoutError") from None
            raise

    transport.call = refusal_then_lost  # type: ignore[method-assign]
    journal = FileCommitJournal(tmp_path / "journal.json")
    [result] = PlanCommitSaga(journal).run(PLAN, _handles(transport))
    assert result.success is False
    state = journal.load()
    assert state is not None
    assert state.phase is JournalPhase.FAILED
    assert state.failed_sandbox_id == IDS[1]
    assert state.rolled_back_ids == [IDS[0]]
    assert _contents(originals) == ["v0\n", "theirs\n"]

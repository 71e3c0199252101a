"""The agent side of the pod executor: a sandbox behind a workspace agent, driven over HTTP.

:class:`RemoteSandbox` is shaped like the core's ``Sandbox`` for the saga and the two-phase
coordinator; every call is one HTTP round trip to the agent of the Sandbox's workspace Pod
(through :meth:`PodExecutor.call <sandbox_operator.executors.pod.PodExecutor.call>`), idempotent
by request id (:func:`state_key` makes the id of a changing call). :func:`create_body` is the
agent's ``create`` request.
"""

from __future__ import annotations

from typing import Any, Protocol

from sandbox_api.models import ROLLBACKABLE_STRATEGIES
from sandbox_core import CommitResult, SandboxStatus
from sandbox_core.agent import wire
from sandbox_core.errors import CommitOutcomeUnknownError
from sandbox_core.protocol import ChangeSummary, PreparedCommit
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.agent_client import AgentRefused, request_id
from sandbox_operator.executors.base import SandboxTarget, WorkspaceNotReady
from sandbox_operator.executors.pod_manifests import overlay_privileged
from sandbox_operator.settings import Settings

OUTCOME_ASKS = 3
"""How often :meth:`RemoteSandbox.commit_outcome` sends a lost commit again before it gives up
(each send waits up to the executor's call timeout)."""


class AgentCaller(Protocol):
    """What a :class:`RemoteSandbox` needs of its executor: one agent call in a Sandbox's
    workspace Pod (:meth:`PodExecutor.call <sandbox_operator.executors.pod.PodExecutor.call>`;
    a Protocol, so that this module does not import the executor that imports it)."""

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
        """The agent's JSON reply."""
        ...


def create_body(target: SandboxTarget, settings: Settings) -> dict[str, Any]:
    """The agent's ``create`` request: deterministic sandbox id (case 18), strategy options.

    ``original`` is a mount path, or ``env:SANDBOX_SOURCE_DSN`` for a Secret (the agent reads
    its own environment; the DSN never crosses the wire).
    """
    options: dict[str, str] = {}
    if target.strategy == "overlay":
        mode = target.options.overlay_mode
        if not overlay_privileged(target, settings):
            mode = "fallback"
        if mode != "auto":
            options["mode"] = mode
    return {
        "plan_id": target.plan_id,
        "resource_id": target.resource_id,
        "strategy": target.strategy,
        "sandbox_id": target.sandbox_id,
        "original": target.original,
        "options": options,
    }


def state_key(reply: dict[str, Any]) -> str:
    """What a changing call depends on: the sandbox revision and status the operator saw (the
    agent counts its changes per sandbox), so a retry of one call has the same request id and
    any later call, even from an equal-looking state, a new one."""
    record = reply.get("record") or {}
    return f"{reply.get('revision', 0)}:{record.get('status')}"


class RemoteSandbox:
    """A sandbox behind a workspace agent, shaped like the core's ``Sandbox`` for the saga."""

    def __init__(self, executor: AgentCaller, target: SandboxTarget, reply: dict[str, Any]):
        self._executor = executor
        self._target = target
        self.reply = reply
        self.resource_id = target.resource_id
        self.strategy = target.strategy
        self.context = None

    @property
    def sandbox_id(self) -> str:
        """The core sandbox id."""
        return self._target.sandbox_id

    @property
    def record(self) -> dict[str, Any]:
        """The core record as last reported by the agent."""
        return dict(self.reply.get("record") or {})

    @property
    def status(self) -> SandboxStatus:
        """Status as last reported by the agent."""
        return SandboxStatus(str(self.record.get("status") or "pending"))

    @property
    def rollbackable(self) -> bool:
        """Whether a commit can be undone (seed 002)."""
        return self._target.strategy in ROLLBACKABLE_STRATEGIES

    def _call(
        self, route: wire.Route, body: dict[str, Any] | None = None, *, request_id: str = ""
    ) -> dict[str, Any]:
        """One call of the agent's ``route`` for this sandbox."""
        path = route.path(sid=self.sandbox_id)
        return self._executor.call(self._target, route.method, path, body, request_id=request_id)

    def _refresh(self) -> None:
        self.reply = self._call(wire.STATUS)

    def commit(self, message: str | None = None) -> CommitResult:
        """``POST .../commit``; the request id repeats for the same commit from the same state.

        Raises:
            CommitOutcomeUnknownError: the reply was lost (the agent could not be reached, or
                timed out): the commit may have landed. :meth:`commit_outcome` asks.
            ExecutorError: the agent refused the commit (it did not land).
        """
        rid = request_id("commit", self.sandbox_id, message or "", state_key(self.reply))
        self._sent_commit = (rid, message)
        try:
            payload = self._call(wire.COMMIT, {"message": message}, request_id=rid)
        except ExecutorError as exc:
            if not exc.retryable:  # a refusal: it did not land
                self._refresh()
                raise
            raise CommitOutcomeUnknownError(
                f"the reply of the commit of sandbox {self.sandbox_id} was lost: {exc}"
            ) from exc
        self.reply = payload["sandbox"]
        return CommitResult.from_dict(payload["result"])

    def commit_outcome(self, message: str | None = None) -> CommitResult | None:
        """After a lost commit reply: ask the agent by sending the same request again.

        The agent runs one request at a time and stores every reply under its request id
        before sending it, so the repeat waits for the first to finish and gets its stored
        reply (a replay: nothing is done twice). Asked :data:`OUTCOME_ASKS` times at most.

        Returns:
            The commit's result when it landed.

        Raises:
            CommitOutcomeUnknownError: the agent still cannot be reached.
            SandboxError: the agent's refusal of the commit (it did not land), as the core
                error it stands for.
        """
        rid, sent = getattr(self, "_sent_commit", (None, message))
        if rid is None:
            raise CommitOutcomeUnknownError(f"no commit of sandbox {self.sandbox_id} was sent")
        last: Exception | None = None
        for _ in range(OUTCOME_ASKS):
            try:
                payload = self._call(wire.COMMIT, {"message": sent}, request_id=rid)
            except AgentRefused as exc:
                raise wire.core_error(exc.error, exc.detail) from None
            except (ExecutorError, WorkspaceNotReady) as exc:
                last = exc
                continue
            self.reply = payload["sandbox"]
            return CommitResult.from_dict(payload["result"])
        raise CommitOutcomeUnknownError(
            f"the outcome of the commit of sandbox {self.sandbox_id} is unknown: the agent "
            f"could not be asked ({last})"
        )

    def rollback(self) -> None:
        """``POST .../rollback`` (no re-activation: the saga's compensation)."""
        rid = request_id("rollback", self.sandbox_id, state_key(self.reply))
        self.reply = self._call(wire.ROLLBACK, {"reactivate": False}, request_id=rid)

    # -- two-phase plan commit -----------------------------------------------------------------

    @property
    def prepares_durably(self) -> bool:
        """Whether the agent's sandbox survives a crash between prepare and apply (SQLite does
        not: it can only be the plan's last resource)."""
        return bool(self.reply.get("prepares_durably", True))

    def _two_phase(self, route: wire.Route, body: dict[str, Any], rid: str) -> dict[str, Any]:
        """One two-phase call; the agent's refusal raised as the core error it stands for
        (transport failures stay retryable ``ExecutorError``s)."""
        try:
            payload = self._call(route, body, request_id=rid)
        except AgentRefused as exc:
            raise wire.core_error(exc.error, exc.detail) from None
        self.reply = payload["sandbox"]
        return payload

    def target_identity(self) -> str:
        """``GET .../target-identity``: what the sandbox's original is, as the agent reads it
        from the original now (a database's system identifier, oid and name); "" when it
        reports none. The operator binds the digests people approve to it
        (``resources.target_identity.BoundHandle``), as it does for the local executor.

        Raises:
            SandboxError: the agent could not read it (the database unreachable...).
        """
        try:
            payload = self._call(wire.TARGET_IDENTITY)
        except AgentRefused as exc:
            raise wire.core_error(exc.error, exc.detail) from None
        return str(payload.get("identity") or "")

    def review(self) -> ChangeSummary:
        """``GET .../review``: what a commit would change now (no locks, nothing changes).

        Raises:
            SandboxStateError: not CREATED/ACTIVE. SandboxError: the changes could not be read.
        """
        try:
            payload = self._call(wire.REVIEW)
        except AgentRefused as exc:
            raise wire.core_error(exc.error, exc.detail) from None
        self.reply = payload["sandbox"]
        return ChangeSummary.from_dict(payload["summary"])

    def prepare(self, txid: str, message: str | None = None) -> PreparedCommit:
        """``POST .../prepare``; a retry after a lost reply (same state seen) is a replay.

        Raises:
            SandboxCommitError: would fail (``conflicts`` set for a conflict).
            TwoPhaseUnavailableError: this sandbox cannot prepare.
            SandboxStateError: not CREATED/ACTIVE.
            ExecutorError: the agent could not be reached (retryable).
        """
        rid = request_id("prepare", self.sandbox_id, txid, message or "", state_key(self.reply))
        payload = self._two_phase(wire.PREPARE, {"txid": txid, "message": message}, rid)
        return PreparedCommit.from_dict(payload["prepared"])

    def apply_prepared(self, txid: str) -> CommitResult:
        """``POST .../apply-prepared``: idempotent per ``txid`` (the agent answers a repeat with
        the recorded result), so the request id is the txid's alone.

        Raises:
            SandboxCommitError: the apply failed; the status is unchanged (retry).
            SandboxStateError: neither CREATED/ACTIVE nor COMMITTED by ``txid``.
            ExecutorError: the agent could not be reached (retryable).
        """
        rid = request_id("apply-prepared", self.sandbox_id, txid)
        payload = self._two_phase(wire.APPLY_PREPARED, {"txid": txid}, rid)
        return CommitResult.from_dict(payload["result"])

    def abort_prepared(self, txid: str) -> None:
        """``POST .../abort-prepared``: idempotent, fine when nothing was prepared.

        Raises:
            SandboxError: the staged state could not be removed (retry).
            ExecutorError: the agent could not be reached (retryable).
        """
        rid = request_id("abort-prepared", self.sandbox_id, txid, state_key(self.reply))
        self._two_phase(wire.ABORT_PREPARED, {"txid": txid}, rid)

    def commit_landed(self) -> bool | None:
        """``GET .../commit-landed``: did a commit whose outcome was lost reach the original?
        None when the strategy cannot tell (recovery then treats the outcome as unknown, as
        ``sandbox_core.plan.saga.probe_commit_landed`` does).

        Raises:
            CommitOutcomeUnknownError: the agent cannot be asked now: recovery must not
                compensate on a guess, it asks again later.
        """
        try:
            payload = self._call(wire.COMMIT_LANDED)
        except AgentRefused:
            return None
        except (ExecutorError, WorkspaceNotReady) as exc:
            raise CommitOutcomeUnknownError(
                f"cannot ask the agent of sandbox {self.sandbox_id} whether its commit "
                f"landed: {exc}"
            ) from exc
        answer = payload.get("landed")
        return answer if isinstance(answer, bool) else None

    def activate(self) -> None:
        """``POST .../activate`` (CREATED/ROLLED_BACK -> ACTIVE)."""
        rid = request_id("activate", self.sandbox_id, state_key(self.reply))
        self.reply = self._call(wire.ACTIVATE, request_id=rid)

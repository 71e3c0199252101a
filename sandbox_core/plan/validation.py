"""Pre-commit validation: checks a plan must pass before anything is prepared (docs/forks.md).

A plan commit may declare :class:`Check` s: one command per sandbox (tests, a linter, a build)
that must exit 0 in that sandbox before the commit prepares anything. The command runs through
the actor's door (the workspace agent's exec route, or the local door on local paths), with a
timeout: this module knows neither, it is given a :data:`CheckRunner`.

Policy:

- Every check runs (one after the other, in the order given), so the approver sees them all.
- A check passes when its command exits 0 within its timeout. A timeout, a non-zero exit, or a
  command the door refused (``SandboxError``: no such sandbox, a bad request) fails it.
- What is kept of a check (:class:`CheckResult`) is bounded and scrubbed: the command's words,
  the exit code, and the last :data:`DEFAULT_TAIL_LINES` lines (at most
  :data:`DEFAULT_TAIL_BYTES` bytes) of its output, with the given secrets and anything shaped
  like ``password=...`` / ``token: ...`` masked. That is what a status, an Event and a review
  may show.
- The results are part of the plan's digest (:func:`~sandbox_core.plan.review.plan_digest`):
  an approval binds the changes *and* the checks they passed, so a re-run that ends otherwise
  is a different plan.
- A failed check aborts the commit before prepare: :func:`~sandbox_core.plan.commit.
  commit_plan` refuses with reason ``ValidationFailed`` and touches no original.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_core.errors import SandboxError
from sandbox_core.redaction import MASK, scrub

__all__ = [
    "DEFAULT_CHECK_TIMEOUT_SECONDS",
    "DEFAULT_TAIL_BYTES",
    "DEFAULT_TAIL_LINES",
    "Check",
    "CheckOutcome",
    "CheckResult",
    "CheckRunner",
    "failed_checks",
    "run_checks",
    "scrub_output",
]

DEFAULT_CHECK_TIMEOUT_SECONDS = 300.0
DEFAULT_TAIL_LINES = 20
DEFAULT_TAIL_BYTES = 4096
MAX_COMMAND_CHARS = 1024
"""How much of a command's words a result keeps (a status stays small)."""

_SECRET_SHAPE = re.compile(
    r"(?i)\b(password|passwd|pwd|token|secret|api[_-]?key|authorization)(\s*[=:]\s*)(\S+)"
)


@dataclass(frozen=True)
class Check:
    """One command that must succeed in one sandbox before the plan is prepared.

    Attributes:
        name: a label unique in the plan (letters, digits, ``.-_``), shown in status and review.
        sandbox_id: the sandbox it runs in (the caller resolves names to ids).
        command: the argv (``command[0]`` found on the jail's PATH); never a shell string, so
            the words shown are the words run.
        timeout_seconds: wall-clock limit, > 0.
    """

    name: str
    sandbox_id: str
    command: tuple[str, ...]
    timeout_seconds: float = DEFAULT_CHECK_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", self.name):
            raise ValueError(f"check name {self.name!r}: use 1-63 letters, digits, '.', '-' or '_'")
        if not self.command or not all(isinstance(word, str) for word in self.command):
            raise ValueError(f"check {self.name}: command must be a non-empty list of strings")
        if not self.timeout_seconds > 0:
            raise ValueError(f"check {self.name}: timeout_seconds must be > 0")


@dataclass(frozen=True)
class CheckOutcome:
    """How a command ended, as the door reports it: exit code, timeout, output (both streams
    in the order written, or stdout then stderr)."""

    exit_code: int
    timed_out: bool = False
    output: bytes = b""


CheckRunner = Callable[[Check], CheckOutcome]
"""Runs one check through the actor's door and waits for it. Raises ``SandboxError`` when the
door refuses it (the check then fails with the refusal as its output)."""


@dataclass(frozen=True)
class CheckResult:
    """What is kept of one check (bounded, scrubbed; module docstring).

    Attributes:
        name / sandbox_id: as the :class:`Check`.
        command: its words, scrubbed, at most :data:`MAX_COMMAND_CHARS` characters in all.
        exit_code: the exit status; ``None`` when it never ran (refused by the door).
        timed_out: killed at its timeout.
        passed: exit code 0 and not timed out.
        output_tail: the last lines of its output, scrubbed and bounded.
        duration_seconds: wall-clock time of the run.
    """

    name: str
    sandbox_id: str
    command: list[str]
    exit_code: int | None
    timed_out: bool
    passed: bool
    output_tail: str = ""
    duration_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def digest_line(self) -> str:
        """What the plan digest binds of this check: sandbox, name, command, exit, verdict
        (never the output: it holds timings)."""
        words = hashlib.sha256(json.dumps(self.command).encode("utf-8")).hexdigest()
        return (
            f"check:{self.sandbox_id}:{self.name}:{words}:{self.exit_code}:"
            f"{'passed' if self.passed else 'failed'}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the shape kept in a PlanCommit's status)."""
        return {
            "name": self.name,
            "sandboxId": self.sandbox_id,
            "command": list(self.command),
            "exitCode": self.exit_code,
            "timedOut": self.timed_out,
            "passed": self.passed,
            "outputTail": self.output_tail,
            "durationSeconds": round(self.duration_seconds, 3),
            **self.extra,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        """From :meth:`to_dict` (the fields it does not know go to ``extra``)."""
        known = {
            "name",
            "sandboxId",
            "command",
            "exitCode",
            "timedOut",
            "passed",
            "outputTail",
            "durationSeconds",
        }
        exit_code = data.get("exitCode")
        return cls(
            name=str(data.get("name") or ""),
            sandbox_id=str(data.get("sandboxId") or ""),
            command=[str(word) for word in data.get("command") or []],
            exit_code=None if exit_code is None else int(exit_code),
            timed_out=bool(data.get("timedOut")),
            passed=bool(data.get("passed")),
            output_tail=str(data.get("outputTail") or ""),
            duration_seconds=float(data.get("durationSeconds") or 0.0),
            extra={key: value for key, value in data.items() if key not in known},
        )


def scrub_output(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every one of ``secrets`` and every ``password=...``-shaped value masked."""
    cleaned = scrub(text, tuple(secrets)) if secrets else text
    return _SECRET_SHAPE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", cleaned)


def _tail(output: bytes, secrets: Sequence[str], max_lines: int, max_bytes: int) -> str:
    text = output.decode("utf-8", errors="replace")
    lines = scrub_output(text, secrets).splitlines()[-max_lines:] if max_lines else []
    kept = "\n".join(lines)
    encoded = kept.encode("utf-8")
    if len(encoded) > max_bytes:
        kept = encoded[-max_bytes:].decode("utf-8", errors="ignore")
    return kept


def _words(command: Sequence[str], secrets: Sequence[str]) -> list[str]:
    words, used = [], 0
    for word in command:
        shown = scrub_output(word, secrets)
        if used + len(shown) > MAX_COMMAND_CHARS:
            words.append("...")
            break
        words.append(shown)
        used += len(shown)
    return words


def run_checks(
    checks: Sequence[Check],
    runner: CheckRunner,
    *,
    secrets: Iterable[str] = (),
    max_lines: int = DEFAULT_TAIL_LINES,
    max_bytes: int = DEFAULT_TAIL_BYTES,
) -> list[CheckResult]:
    """Run every check through ``runner`` (module docstring) and keep what may be shown.

    Args:
        checks: in the order to run; names unique.
        runner: the actor's door for one check.
        secrets: values to mask in commands and output (a DSN's password, a token).
        max_lines / max_bytes: how much of each output's end is kept.

    Returns:
        One :class:`CheckResult` per check, in order.

    Raises:
        ValueError: two checks share a name.
    """
    names = [check.name for check in checks]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"check names must be unique in a plan: {', '.join(duplicates)}")
    hidden = tuple(secrets)
    results = []
    for check in checks:
        started = time.monotonic()
        try:
            outcome = runner(check)
        except SandboxError as exc:
            results.append(
                CheckResult(
                    name=check.name,
                    sandbox_id=check.sandbox_id,
                    command=_words(check.command, hidden),
                    exit_code=None,
                    timed_out=False,
                    passed=False,
                    output_tail=_tail(str(exc).encode(), hidden, max_lines, max_bytes),
                    duration_seconds=time.monotonic() - started,
                )
            )
            continue
        results.append(
            CheckResult(
                name=check.name,
                sandbox_id=check.sandbox_id,
                command=_words(check.command, hidden),
                exit_code=outcome.exit_code,
                timed_out=outcome.timed_out,
                passed=outcome.exit_code == 0 and not outcome.timed_out,
                output_tail=_tail(outcome.output, hidden, max_lines, max_bytes),
                duration_seconds=time.monotonic() - started,
            )
        )
    return results


def failed_checks(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The results that did not pass, in order."""
    return [result for result in results if not result.passed]

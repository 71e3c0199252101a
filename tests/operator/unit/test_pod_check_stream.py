"""How the pod executor reads a pre-commit check's run from the agent's exec stream
(``wire.EXEC``, NDJSON): the exit line decides, the output kept is the tail of each stream, an
error line is the check's refusal, and a stream cut before its exit is a retryable transport
fault, never a pass. (The real agent's stream is read in tier 2:
tests/operator/apiserver/test_pod_forks_and_checks.py.)"""

from __future__ import annotations

import base64
import json

import pytest
from sandbox_operator.errors import ExecutorError
from sandbox_operator.executors.pod import CHECK_OUTPUT_BYTES, read_exec_stream

from sandbox_core.errors import SandboxError


def line(event: str, **fields: object) -> bytes:
    return json.dumps({"event": event, **fields}).encode() + b"\n"


def out(stream: str, data: bytes) -> bytes:
    return line(stream, data_b64=base64.b64encode(data).decode())


def test_the_exit_line_gives_the_code_and_both_streams_in_order() -> None:
    outcome = read_exec_stream(
        [
            line("started", exec_id="e1"),
            out("stdout", b"one\n"),
            out("stderr", b"warn\n"),
            out("stdout", b"two\n"),
            line("exit", exec_id="e1", exit_code=3, timed_out=False),
        ],
        "check c",
    )
    assert (outcome.exit_code, outcome.timed_out) == (3, False)
    assert outcome.output == b"one\ntwo\nwarn\n"


def test_only_the_tail_of_a_long_output_is_kept() -> None:
    chunk = b"x" * 1000 + b"\n"
    lines = [out("stdout", chunk) for _ in range(200)] + [out("stdout", b"last\n")]
    outcome = read_exec_stream([*lines, line("exit", exit_code=0, timed_out=True)], "check c")
    assert len(outcome.output) == CHECK_OUTPUT_BYTES
    assert outcome.output.endswith(b"last\n")
    assert outcome.timed_out


def test_an_error_line_is_the_checks_refusal() -> None:
    error = {"type": "JailUnavailableError", "message": "cannot isolate commands"}
    with pytest.raises(SandboxError, match="cannot isolate commands"):
        read_exec_stream([line("started", exec_id="e"), line("error", error=error)], "check c")


@pytest.mark.parametrize(
    "lines",
    [
        [line("started", exec_id="e"), out("stdout", b"half")],
        [b"not json\n"],
        [line("stdout", data_b64="***")],
    ],
    ids=["cut", "garbled", "bad base64"],
)
def test_a_cut_or_garbled_stream_is_a_retryable_fault_never_a_pass(lines: list[bytes]) -> None:
    with pytest.raises(ExecutorError) as fault:
        read_exec_stream(lines, "check c")
    assert fault.value.retryable

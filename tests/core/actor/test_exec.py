"""Commands in a sandbox on local paths (issue "The actor's door", item 1): streamed output,
the exit code, argv and shell lines, stdin, environment, a working directory that cannot leave
the sandbox, timeouts, cancel and signals, output caps, the limit per sandbox, and the
strategies that have no working tree."""

from __future__ import annotations

import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import pytest

from sandbox_core.actor import exec as exec_module
from sandbox_core.actor.exec import (
    READ_BYTES,
    CommandRunner,
    ExecLimitError,
    ExecRefusedError,
    ExecRequest,
)
from sandbox_core.strategies.factory import SandboxFactory
from tests.support.actor import Layout, MakeSandbox


def test_output_streams_as_the_command_writes_it_and_the_exit_code_comes_last(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("git_worktree")
    line = "echo one; sleep 1; echo two >&2; exit 3"
    execution = layout.runner().start(sandbox, ExecRequest(shell_line=line))
    started = time.monotonic()
    seen = []
    for chunk in execution:
        seen.append((chunk.stream, chunk.data, time.monotonic() - started))
    assert [(stream, data) for stream, data, _ in seen] == [
        ("stdout", b"one\n"),
        ("stderr", b"two\n"),
    ]
    assert seen[0][2] < 0.8 <= seen[1][2]  # the first line came before the command ended
    result = execution.result
    assert (result.exit_code, result.signal, result.timed_out, result.truncated) == (
        3,
        None,
        False,
        False,
    )
    assert (result.stdout_bytes, result.stderr_bytes) == (4, 4)


def test_output_written_within_the_window_leaves_as_one_chunk_and_a_pause_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(exec_module, "COALESCE_SECONDS", 0.5)
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        os.write(write_end, b"a" * 4096)

        def later() -> None:
            time.sleep(0.05)
            os.write(write_end, b"b" * 4096)

        writer = threading.Thread(target=later)
        writer.start()
        started = time.monotonic()
        data, ended = exec_module._gather(read_end)
        waited = time.monotonic() - started
        writer.join()
        assert (data, ended) == (b"a" * 4096 + b"b" * 4096, False)
        assert 0.05 <= waited < 5  # it waited for the second write, then for the window
        os.write(write_end, b"c")
        os.close(write_end)
        write_end = -1
        assert exec_module._gather(read_end) == (b"c", True)  # the end is seen at once
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_a_fast_writers_small_writes_leave_as_large_chunks(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    size = 8 * 1024 * 1024
    request = ExecRequest(argv=("head", "-c", str(size), "/dev/zero"), max_output_bytes=size)
    sizes = [len(chunk.data) for chunk in layout.runner().start(sandbox, request)]
    assert sum(sizes) == size
    assert max(sizes) <= READ_BYTES
    assert statistics.median(sizes) >= 64 * 1024, sizes  # head writes 4-8 KiB at a time


def test_argv_stdin_environment_and_a_working_directory_in_the_sandbox(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    runner = layout.runner()
    out, _, result = runner.run(sandbox, ExecRequest(argv=("cat",), stdin=b"from stdin\x00\xff"))
    assert (out, result.exit_code) == (b"from stdin\x00\xff", 0)
    request = ExecRequest(
        argv=("sh", "-c", 'pwd; echo "$GREETING"; ls'), cwd="d", env={"GREETING": "hi there"}
    )
    out, _, _ = runner.run(sandbox, request)
    assert out.decode().splitlines() == [
        str(Path(sandbox.get_path("d")).resolve()),
        "hi there",
        "g.txt",
    ]
    _, _, result = runner.run(sandbox, ExecRequest(argv=("no-such-program",)))
    assert result.exit_code != 0


@pytest.mark.parametrize("cwd", ["..", "../..", "d/../..", "/etc", "/", "escape", "escape/x"])
def test_a_working_directory_outside_the_sandbox_is_refused(
    layout: Layout, make_sandbox: MakeSandbox, cwd: str
) -> None:
    sandbox = make_sandbox("copy_on_write")
    Path(sandbox.get_path("escape")).symlink_to(layout.state)
    with pytest.raises(ValueError, match="Path traversal not allowed"):
        layout.runner().start(sandbox, ExecRequest(argv=("ls",), cwd=cwd))
    assert not (layout.state / "actor" / sandbox.sandbox_id / "audit.jsonl").exists()


def test_a_working_directory_that_is_a_file_or_git_metadata_is_refused(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("git_worktree")
    with pytest.raises(ExecRefusedError, match="not a directory"):
        layout.runner().start(sandbox, ExecRequest(argv=("ls",), cwd="f.txt"))
    with pytest.raises(ValueError, match="Path traversal not allowed"):
        layout.runner().start(sandbox, ExecRequest(argv=("ls",), cwd=".git"))


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"argv": ("ls",), "shell_line": "ls"},
        {"argv": ("ls",), "env": {"BAD NAME": "x"}},
        {"argv": ("ls",), "timeout_seconds": 0},
        {"argv": ("ls",), "max_output_bytes": -1},
        {"argv": ("a\x00b",)},
    ],
)
def test_a_malformed_request_is_refused(bad: dict) -> None:
    with pytest.raises(ExecRefusedError):
        ExecRequest(**bad)


def test_a_command_past_its_timeout_is_killed_with_everything_it_started(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    line = "(sleep 3; echo late > late.txt) & sleep 30"
    started = time.monotonic()
    _, _, result = layout.runner().run(sandbox, ExecRequest(shell_line=line, timeout_seconds=1))
    assert result.timed_out and result.signal == 9 and result.exit_code == 137
    assert time.monotonic() - started < 5
    time.sleep(3)
    assert not Path(sandbox.get_path("late.txt")).exists()  # the background job died with it


def test_a_signal_reaches_the_command_and_cancel_kills_it(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    runner = layout.runner()
    line = "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.1; done"
    execution = runner.start(sandbox, ExecRequest(shell_line=line))
    chunks = iter(execution)
    assert next(chunks).data == b"ready\n"
    assert runner.find(execution.exec_id) is execution
    assert execution.send_signal("TERM")
    rest = b"".join(chunk.data for chunk in chunks if chunk.stream == "stdout")
    assert rest == b"got-term\n" and execution.result.exit_code == 7
    assert runner.find(execution.exec_id) is None
    assert not execution.send_signal("SIGTERM")  # it has ended
    with pytest.raises(ExecRefusedError, match="unknown signal"):
        execution.send_signal("SIGNOPE")

    execution = runner.start(sandbox, ExecRequest(shell_line="echo ready; sleep 30"))
    chunks = iter(execution)
    next(chunks)
    execution.cancel()
    list(chunks)
    assert execution.result.cancelled and execution.result.signal == 9


def test_leaving_the_output_early_kills_the_command(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    runner = layout.runner()
    execution = runner.start(sandbox, ExecRequest(shell_line="echo ready; sleep 30"))
    chunks = iter(execution)
    next(chunks)
    chunks.close()  # type: ignore[attr-defined]
    assert execution.result.cancelled
    assert runner.running(sandbox.sandbox_id) == 0


def test_output_beyond_the_cap_is_dropped_and_says_truncated(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("copy_on_write")
    request = ExecRequest(
        shell_line="head -c 3000000 /dev/zero; echo err >&2", max_output_bytes=1000
    )
    out, err, result = layout.runner().run(sandbox, request)
    assert (len(out), err, result.truncated) == (1000, b"err\n", True)
    assert (result.stdout_bytes, result.exit_code) == (3000000, 0)  # never blocked on the pipe


def test_the_limit_per_sandbox_refuses_one_more_command_and_frees_on_exit(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    first, second = make_sandbox("copy_on_write"), make_sandbox("overlay-fallback")
    runner = layout.runner(max_concurrent=2)
    running = [runner.start(first, ExecRequest(shell_line="sleep 30")) for _ in range(2)]
    with pytest.raises(ExecLimitError, match="limit"):
        runner.start(first, ExecRequest(argv=("true",)))
    assert runner.run(second, ExecRequest(argv=("true",)))[2].exit_code == 0  # per sandbox
    for execution in running:
        execution.cancel()
        execution.wait()
    assert runner.running(first.sandbox_id) == 0
    assert runner.run(first, ExecRequest(argv=("true",)))[2].exit_code == 0


def test_commands_in_parallel_threads_each_get_their_own_output(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    sandbox = make_sandbox("git_worktree")
    runner = layout.runner(max_concurrent=4)
    outputs: dict[int, bytes] = {}

    def run(n: int) -> None:
        outputs[n] = runner.run(
            sandbox, ExecRequest(shell_line=f"seq {n} 1000 | tail -1; echo {n}")
        )[0]

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == {n: f"1000\n{n}\n".encode() for n in range(4)}
    assert layout.runner().audit(sandbox.sandbox_id).read()["total"] == 4


def test_a_database_sandbox_has_no_working_tree_and_refuses_commands(layout: Layout) -> None:
    database = layout.root / "app.db"
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE t (x)")
    sandbox = SandboxFactory().create(
        "transaction_rollback", "db", f"sqlite:///{database}", sandbox_root=str(layout.root / "sb")
    )
    sandbox.create("plan-a")
    try:
        with pytest.raises(ExecRefusedError, match="no working tree"):
            layout.runner().start(sandbox, ExecRequest(argv=("true",)))
    finally:
        sandbox.cleanup()


def test_no_bubblewrap_means_no_command_rather_than_an_unjailed_one(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    from sandbox_core.actor.jail import Jail, JailUnavailableError

    sandbox = make_sandbox("copy_on_write")
    runner = CommandRunner(layout.state, jail=Jail(bwrap="no-such-bwrap"))
    with pytest.raises(JailUnavailableError, match="bubblewrap"):
        runner.start(sandbox, ExecRequest(shell_line="touch ran"))
    assert not Path(sandbox.get_path("ran")).exists()
    assert runner.running(sandbox.sandbox_id) == 0
    runs = layout.state / "actor" / sandbox.sandbox_id / "runs"
    assert not runs.exists() or not list(runs.iterdir())


def test_a_bubblewrap_that_cannot_build_its_namespaces_refuses_every_command(
    layout: Layout, make_sandbox: MakeSandbox
) -> None:
    """What ``bwrap`` says in a container whose seccomp profile refuses its namespaces: both
    probes (a fresh /proc, the container's /proc bound) fail, every command is refused."""
    from sandbox_core.actor.jail import Jail, JailUnavailableError

    fake = layout.root / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "bwrap: No permissions to create new namespace" >&2\nexit 1\n')
    fake.chmod(0o755)
    sandbox = make_sandbox("copy_on_write")
    runner = CommandRunner(layout.state, jail=Jail(bwrap=str(fake)))
    for _ in range(2):  # a failed probe is not remembered as working
        with pytest.raises(JailUnavailableError) as refused:
            runner.start(sandbox, ExecRequest(shell_line="touch ran"))
        said = str(refused.value)
        assert said.count("No permissions to create new namespace") == 2, said
        assert "fresh /proc: bwrap: No" in said and "bound /proc: bwrap: No" in said
        assert "Localhost profile" in said
    assert not Path(sandbox.get_path("ran")).exists()
    assert runner.running(sandbox.sandbox_id) == 0


def test_a_command_activates_a_created_sandbox_through_the_local_door(layout: Layout) -> None:
    from sandbox_core.actor.local import LocalActor
    from sandbox_core.host.host import SandboxHost
    from sandbox_core.host.store import SandboxStore
    from tests.support.gitrepo import make_repo

    repo = make_repo(layout.root / "repo", {"f.txt": "base\n"})
    host = SandboxHost(SandboxStore(layout.state))
    sandbox = host.provision(
        "plan-a", "repo", str(repo), "git_worktree", sandbox_root=str(layout.root / "sb")
    )
    assert sandbox.status.value == "created"
    actor = LocalActor(layout.state)
    out, _, result = actor.exec(
        sandbox.sandbox_id, ExecRequest(shell_line="cat f.txt; echo new > n.txt")
    ).collect()
    assert (out, result.exit_code) == (b"base\n", 0)
    reopened = host.reopen(sandbox.sandbox_id)
    assert reopened.status.value == "active"
    assert "n.txt" in reopened.review().added
    assert actor.audit(sandbox.sandbox_id)["entries"][0]["shell"].startswith("cat f.txt")
    reopened.cleanup()
    assert os.path.isdir(repo)

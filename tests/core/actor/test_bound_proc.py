"""The jail where a fresh ``/proc`` cannot be mounted (a container: its runtime masks parts of
``/proc``), attacked. The masked ``/proc`` is emulated as docs/security.md says it can be: a
mount namespace whose ``/proc/sys`` is a read-only bind, which makes the kernel refuse a new
``proc`` mount in a user namespace exactly as in a workspace Pod. There the probe of
``Jail()`` chooses the container's ``/proc`` bound read-only, and a command run by a stand-in
agent (tests/support/bound_proc_agent.py) tries to reach the agent's token, state, original and
environment through ``/proc/<agent pid>/{root,cwd,environ,fd,mem,maps}``, to signal it, to write
outside its sandbox and to create a user namespace. Each attempt fails: the kernel's ptrace
access check refuses a process in a child user namespace without capabilities, a signal or a
pidfd reaches only its own PID namespace, the seccomp filter refuses ``CLONE_NEWUSER``.

The same attacks as tests/core/actor/test_isolation.py, and the git attacks, also run here in a
jail forced to the bound mode in this process (no emulation needed: the mode is chosen by
``Jail(proc="bound")``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_core.actor.exec import CommandRunner, ExecRequest
from sandbox_core.actor.jail import Jail
from sandbox_core.actor.userns_filter import UnsupportedArchitectureError, program
from tests.support.actor import DSN_SECRET, KINDS, Layout, MakeSandbox
from tests.support.gitrepo import GIT_ENV
from tests.support.jail_attacks import (
    GIT_ATTACKS,
    SECRETS,
    agent_state,
    attack,
    git_state,
    tree_digest,
)

REPO = Path(__file__).resolve().parents[3]
MASK = (
    'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys /proc/sys && exec "$@"'
)


def in_masked_proc(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a new mount namespace whose ``/proc/sys`` is read-only (as root, or as
    root of a new user namespace)."""
    assert shutil.which("unshare"), "unshare (util-linux) is needed to emulate a masked /proc"
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    prefix = ["unshare", *user, "--mount", "--propagation", "private", "sh", "-c", MASK, "sh"]
    return subprocess.run(
        [*prefix, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
        check=False,
    )


def test_the_emulated_masked_proc_refuses_a_fresh_proc_as_a_container_does() -> None:
    probe = "from sandbox_core.actor.jail import Jail; Jail(proc='fresh').check()"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'operator'}"}
    done = in_masked_proc([sys.executable, "-c", probe], env)
    assert done.returncode != 0
    assert "Can't mount proc on /newroot/proc: Operation not permitted" in done.stderr


def test_behind_a_masked_proc_the_jail_binds_it_and_nothing_of_the_agent_is_reachable(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{REPO / 'operator'}",
        "SANDBOX_SOURCE_DSN": DSN_SECRET,  # in the agent's environ as exec'd
    }
    done = in_masked_proc(
        [sys.executable, "-m", "tests.support.bound_proc_agent", str(tmp_path)], env
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    output: str = report["output"]
    assert report["mode"] == "bound", report  # the probe chose the fallback
    assert done.stderr.count("a fresh /proc cannot be mounted here") == 1  # logged once
    assert "sweep=" in output and "\ndone\n" in output, output  # the attack ran to its end
    for secret in (*SECRETS, DSN_SECRET, "pw-secret-42"):
        assert secret not in output, f"{secret} leaked: {output}"
    status = dict(
        line.split("=", 1) for line in output.splitlines() if "=" in line and " " not in line
    )
    refused = [
        "environ", "task-environ", "root-token", "root-state", "root-original", "root-other",
        "cwd-token", "cwd-link", "exe-link", "fd-link", "fd-open", "mem", "maps",
        "pidfd-signal", "write-original", "write-proc-sys", "write-oom", "unshare-user",
    ]  # fmt: skip
    for name in refused:
        assert status.get(name, "0") != "0", f"{name} succeeded: {output}"
    assert status["unshare-user-libc"] == "1"  # EPERM from the seccomp filter
    assert output.count("Permission denied") >= 10, output  # the ptrace check, not absence
    assert "Invalid argument" in output  # pidfd_send_signal: not in the caller's PID namespace
    assert report["original_kept"] and report["state_kept"]


@pytest.fixture
def bound() -> Jail:
    jail = Jail(proc="bound")
    jail.check()  # JailUnavailableError fails the test: hack/setup.sh installs bwrap
    return jail


@pytest.mark.parametrize("kind", [*KINDS, pytest.param("none", id="none")])
def test_a_bound_proc_jail_reads_nothing_of_the_agent_nor_of_another_sandbox(
    layout: Layout, make_sandbox: MakeSandbox, bound: Jail, kind: str
) -> None:
    sandbox = make_sandbox(kind)
    original = Path(sandbox.original_path)
    before = tree_digest(original) if kind != "none" else None
    state_before = agent_state(layout)
    out, err, result = CommandRunner(layout.state, bound).run(
        sandbox, ExecRequest(shell_line=attack(layout, original))
    )
    text = (out + err).decode(errors="replace")
    assert "done" in text, text
    for secret in SECRETS:
        assert secret not in text, f"{secret} leaked: {text}"
    assert "/proc/1/root/etc/hostname: Permission denied" in text  # visible, not readable
    assert "unshare failed: Operation not permitted" in text
    assert agent_state(layout) == state_before
    if before is not None:
        assert tree_digest(original) == before
    assert result.exit_code == 0


@pytest.mark.parametrize("line", GIT_ATTACKS)
def test_git_in_a_bound_proc_jail_never_moves_the_originals_refs_config_hooks_or_index(
    layout: Layout, make_sandbox: MakeSandbox, bound: Jail, line: str
) -> None:
    sandbox = make_sandbox("git_worktree")
    repo = Path(sandbox.original_path)
    before = git_state(repo)
    CommandRunner(layout.state, bound).run(sandbox, ExecRequest(shell_line=line, env=GIT_ENV))
    assert git_state(repo) == before


def test_the_filter_refuses_new_user_namespaces_and_only_them(
    layout: Layout, make_sandbox: MakeSandbox, bound: Jail
) -> None:
    sandbox = make_sandbox("copy_on_write")
    script = (
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(nr, *args):\n"
        "    return libc.syscall(nr, *args), ctypes.get_errno()\n"
        "nr = {'x86_64': (272, 435), 'aarch64': (97, 435)}[os.uname().machine]\n"
        "print('unshare-user', call(nr[0], 0x10000000))\n"
        "print('clone3', call(nr[1], 0, 0))\n"
        "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
        "pid = os.fork()\n"
        "if pid == 0: os._exit(7)\n"
        "print('child', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    out, err, _ = CommandRunner(layout.state, bound).run(
        sandbox, ExecRequest(argv=("python3", "-c", script))
    )
    assert out.decode().splitlines() == [
        "unshare-user (-1, 1)",  # EPERM
        "clone3 (-1, 38)",  # ENOSYS: the C library falls back to clone, which is checked
        "thread",
        "child 7",
    ], err


def test_the_filter_is_known_for_two_architectures_only() -> None:
    assert len(program("x86_64")) % 8 == 0 and len(program("aarch64")) % 8 == 0
    assert program("x86_64") != program("aarch64")
    with pytest.raises(UnsupportedArchitectureError, match="riscv64"):
        program("riscv64")

"""A stand-in workspace agent whose commands attack it through a bound ``/proc``.

``python -m tests.support.bound_proc_agent ROOT`` (run by tests/core/actor/test_bound_proc.py
inside a mount namespace whose ``/proc/sys`` is read-only, as a container runtime leaves it, and
by hand inside a runc container shaped like the workspace Pod) holds what a command must never
reach, the way the agent does:

- its token file open (``/proc/<pid>/fd/<n>``), its current directory in its state directory
  (``/proc/<pid>/cwd``), a DSN in its environment as it was exec'd (``/proc/<pid>/environ``),
  its root holding the original and another sandbox (``/proc/<pid>/root``);

then builds the jail its own way (``Jail()``: the probe chooses the ``/proc`` mode), runs
:func:`attack` in a copy_on_write sandbox and prints one JSON object: ``mode``, ``pid``,
``token_fd``, ``output``, ``exit_code``, and whether the original and the state stayed as they
were (``original_kept``, ``state_kept``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from sandbox_core.actor.exec import CommandRunner, ExecRequest
from sandbox_core.actor.jail import Jail
from sandbox_core.actor.userns_filter import CLONE_NEWUSER
from tests.support.actor import FILES, Layout
from tests.support.directory_sandboxes import new_sandbox


def digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and "actor" not in p.relative_to(root).parts
    }


def attack(layout: Layout, original: Path, pid: int, token_fd: int) -> str:
    """A shell line trying every way out through ``/proc`` it knows of, each attempt labelled
    with its exit status (``name=STATUS``), then ``done``."""
    own = f"/proc/{pid}"
    tries = {
        "environ": f"cat {own}/environ",
        "root-token": f"cat {own}/root{layout.token}",
        "root-state": f"ls {own}/root{layout.state}",
        "root-original": f"cat {own}/root{original}/f.txt",
        "root-other": f"cat {own}/root{layout.other}/private.txt",
        "cwd-token": f"cat {own}/cwd/token",
        "cwd-link": f"readlink -e {own}/cwd",
        "exe-link": f"readlink -e {own}/exe",
        "fd-link": f"readlink -e {own}/fd/{token_fd}",
        "fd-open": f"cat {own}/fd/{token_fd}",
        "mem": f"head -c 16 {own}/mem",
        "maps": f"cat {own}/maps",
        "task-environ": f"cat {own}/task/{pid}/environ",
        "kill": f"kill -TERM {pid}",
        "pidfd-signal": (
            "python3 -c 'import os, signal; "
            f'signal.pidfd_send_signal(os.open("{own}", os.O_RDONLY), signal.SIGTERM)\''
        ),
        "write-original": f"echo pwned > {original}/f.txt",
        "write-proc-sys": "echo 1 > /proc/sys/kernel/ns_last_pid",
        "write-oom": "echo 1000 > /proc/self/oom_score_adj",
        "unshare-user": "unshare -U true",
        "unshare-user-libc": (
            "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
            f"raise SystemExit(libc.unshare({CLONE_NEWUSER}) and ctypes.get_errno())'"
        ),
    }
    lines = [f"{cmd} 2>&1; echo {name}=$?" for name, cmd in tries.items()]
    # Every process the command can see, not just the agent: nothing of any of them is readable
    # unless it is the jail's own (its root is the jail's, which holds no secret).
    # (Descriptors are resolved, not read: the jail's own are the pipes it writes to.)
    lines.append(
        "for p in /proc/[0-9]*; do timeout 5 cat $p/environ $p/cwd/token $p/root"
        f"{layout.token} 2>/dev/null; readlink $p/fd/*; done 2>/dev/null; echo sweep=$?"
    )
    lines.append("echo done")
    return "\n".join(lines)


def main(root: Path) -> None:
    layout = Layout(root)
    token_fd = os.open(layout.token, os.O_RDONLY)  # held, as a running agent holds files
    original = root / "original"
    original.mkdir()
    for name, text in FILES.items():
        (original / name).parent.mkdir(parents=True, exist_ok=True)
        (original / name).write_text(text)
    sandbox = new_sandbox("copy_on_write", original, root / "sandboxes")
    sandbox.create("plan-a")
    sandbox.activate()
    os.chdir(layout.state)
    before = (digest(original), digest(layout.state))
    jail = Jail()
    mode = jail.check()
    out, err, result = CommandRunner(layout.state, jail).run(
        sandbox, ExecRequest(shell_line=attack(layout, original, os.getpid(), token_fd))
    )
    after = (digest(original), digest(layout.state))
    sandbox.cleanup()
    print(
        json.dumps(
            {
                "mode": mode,
                "pid": os.getpid(),
                "token_fd": token_fd,
                "output": (out + err).decode("utf-8", "replace"),
                "exit_code": result.exit_code,
                "original_kept": before[0] == after[0],
                "state_kept": before[1] == after[1],
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))

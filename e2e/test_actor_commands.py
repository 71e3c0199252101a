"""Tier 3: an actor's commands and SQL through the door of real workspace Pods, and the jail
attacked there.

The chart is installed with ``workspace.seccompProfile.type=Localhost`` (e2e/conftest.py), and
e2e/cluster installs the chart's profile on the node: the workspace Pods run under
RuntimeDefault plus what bubblewrap needs. This cluster's runtime (containerd 1.6, runc 1.1)
masks ``/proc``, so the agent's probe binds the container's ``/proc`` read-only into the jail
(docs/security.md, "Commands in a workspace Pod"). One plan of three sandboxes:

- ``data`` (copy_on_write): shell commands (``sed -i``, a build output) through the client;
  then a command attacking the agent: its token file, its state, the original, and through
  ``/proc/1`` (the agent) its environment, root, working directory, descriptors, memory, a
  signal, plus a new user namespace. All refused; the token is nowhere in the output.
- ``app`` (git_worktree): a command edits a file, then git attacks on the original's refs and
  config (``git checkout main && git commit``, ``git config core.hooksPath``): the original
  repository does not move.
- ``db`` (transaction_rollback on PostgreSQL in a Pod): a SQL session through the agent
  (insert, executemany, a query seeing its own rows); the server sees nothing before the commit.

A person approves the reviewed plan; the PlanCommit commits all of it: the command's writes in
the directory and the repository, the rows on the server.
"""

from __future__ import annotations

import secrets
from typing import Any

from e2e.conftest import Originals
from e2e.kube import Kube
from e2e.test_client_pod_executor import approver
from e2e.test_two_phase import psql, start_postgres
from sandbox_client import Plan, SandboxClient
from sandbox_core.agent import wire

AGENT = "/proc/1"  # the workspace agent: the container's first process (no init before it)


def claim(sub_path: str) -> dict[str, Any]:
    return {"persistentVolumeClaim": {"claimName": "originals", "subPath": sub_path}}


def attack() -> str:
    """Every way out of the jail in a Pod, each labelled with its exit status, then ``done``."""
    tries = {
        "token": f"cat {wire.TOKEN_FILE}",
        "state": "ls /workspace/scratch/state",
        "original": "ls /workspace/source",
        "write-original": "echo pwned > /workspace/source/g.txt",
        "environ": f"cat {AGENT}/environ",
        "root-token": f"cat {AGENT}/root{wire.TOKEN_FILE}",
        "root-state": f"ls {AGENT}/root/workspace/scratch/state",
        "root-original": f"ls {AGENT}/root/workspace/source",
        "cwd": f"ls {AGENT}/cwd/",
        "exe": f"readlink -e {AGENT}/exe",
        "fd-open": f"(for f in {AGENT}/fd/*; do cat $f || exit 1; done)",
        "mem": f"head -c 16 {AGENT}/mem",
        "maps": f"cat {AGENT}/maps",
        "pidfd-signal": (
            "python3 -c 'import os, signal; "
            f'signal.pidfd_send_signal(os.open("{AGENT}", os.O_RDONLY), signal.SIGTERM)\''
        ),
        "write-proc": "echo 1000 > /proc/self/oom_score_adj",
        "unshare-user": "unshare -U true",
        "mount": "mount -t tmpfs x /tmp",
    }
    lines = [f"{cmd} 2>&1; echo {name}=$?" for name, cmd in tries.items()]
    lines.append(
        "for p in /proc/[0-9]*; do timeout 5 cat $p/environ $p/root"
        f"{wire.TOKEN_FILE} 2>/dev/null; done; echo sweep=$?"
    )
    return "\n".join([*lines, "echo done"])


GIT_ATTACKS = (
    "git checkout -q main && git commit -q --allow-empty -m evil",
    "git config core.hooksPath /tmp && git config user.name hacker",
    'echo evil > "$(git rev-parse --git-common-dir)/hooks/pre-commit"',
)


def test_commands_and_sql_through_the_door_of_real_pods_are_jailed_and_committed(
    kube: Kube, namespace: str, originals: Originals
) -> None:
    password = f"pw{secrets.token_hex(12)}"
    pod_ip = start_postgres(kube, namespace, password)
    psql(kube, namespace, "CREATE TABLE door_items (body text PRIMARY KEY)")
    dsn = f"postgresql://postgres:{password}@{pod_ip}:5432/postgres?connect_timeout=5"
    kube.apply(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "db"},
            "stringData": {"dsn": dsn},
        },
    )
    client = SandboxClient(namespace=namespace)
    plan = Plan(client, "actor-e2e", namespace)
    data = plan.add_sandbox("data", "copy_on_write", claim("data"))
    app = plan.add_sandbox("app", "git_worktree", claim("repos/app"))
    egress = [{"cidr": f"{pod_ip}/32", "ports": [{"port": 5432, "protocol": "TCP"}]}]
    db = plan.add_sandbox(
        "db", "transaction_rollback", {"secretRef": {"name": "db", "key": "dsn"}},
        workspace={"egress": egress},
    )  # fmt: skip
    infos = {info.spec.resource_id: info for info in plan.wait_ready(timeout=300)}
    assert all(info.executor == "pod" and info.workspace_pod for info in infos.values())
    pod = kube.json("get", "pod", infos["data"].workspace_pod, "-n", namespace)
    assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == "Localhost"

    # Shell writes land in the sandbox.
    ran = data.exec("sed -i s/d0/d1/ g.txt && echo built > out.txt && cat g.txt", timeout=120)
    assert (ran.exit_code, ran.stdout) == (0, b"d1\n"), ran
    assert sorted(data.list_files()) == ["g.txt", "out.txt"]
    assert originals.read("data/g.txt") == "d0\n"  # the original only moves at the commit

    # The jail in the Pod, attacked.
    token = kube.exec(
        namespace, infos["data"].workspace_pod, f"cat {wire.TOKEN_FILE}", container="workspace"
    ).strip()
    assert len(token) >= 32
    tried = data.exec(attack(), timeout=120)
    output = (tried.stdout + tried.stderr).decode("utf-8", "replace")
    assert "\ndone\n" in output, output
    assert token not in output, "the agent's token leaked"
    assert "SANDBOX_AGENT_" not in output, "the agent's environment leaked"
    status = dict(
        line.split("=", 1) for line in output.splitlines() if "=" in line and " " not in line
    )
    for name in (
        "token", "state", "original", "write-original", "environ", "root-token", "root-state",
        "root-original", "cwd", "exe", "fd-open", "mem", "maps", "pidfd-signal", "write-proc",
        "unshare-user", "mount",
    ):  # fmt: skip
        assert status.get(name, "0") != "0", f"{name} succeeded in the Pod: {output}"
    assert output.count("Permission denied") >= 6, output  # the kernel's ptrace check
    assert originals.read("data/g.txt") == "d0\n"
    logs = kube.kubectl("logs", "-n", namespace, infos["data"].workspace_pod, "-c", "workspace")
    assert logs.count("a fresh /proc cannot be mounted here") == 1, logs[-3000:]

    # Git in the worktree's jail: the file change stays, the original repository does not move.
    refs_before = originals.git("for-each-ref", "--format=%(refname) %(objectname)")
    config_before = originals.sh("cat repos/app/.git/config")
    edited = app.exec("sed -i s/line1/line2/ f.txt && cat f.txt", timeout=120)
    assert (edited.exit_code, edited.stdout) == (0, b"line2\n"), edited
    identity = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.com"}
    identity |= {"GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.com"}
    for line in GIT_ATTACKS:
        app.exec(line, timeout=120, env=identity)
    assert originals.git("for-each-ref", "--format=%(refname) %(objectname)") == refs_before
    assert originals.sh("cat repos/app/.git/config") == config_before
    assert originals.sh("test -e repos/app/.git/hooks/pre-commit && echo planted || echo no") == (
        "no\n"
    )

    # A SQL session through the agent: its own rows visible to it, none on the server yet.
    assert db.sql("INSERT INTO door_items (body) VALUES (%s)", ["one"]).rowcount == 1
    assert (
        db.sql_many("INSERT INTO door_items (body) VALUES (%s)", [["two"], ["three"]]).rowcount == 2
    )
    query = db.sql("SELECT body FROM door_items ORDER BY body")
    assert (query.columns, query.rows) == (["body"], [["one"], ["three"], ["two"]])
    assert psql(kube, namespace, "SELECT count(*) FROM door_items") == "0"

    commands = [e for e in data.audit().entries if e.get("op") == "exec"]
    assert len(commands) == 2 and commands[0]["exit_code"] == 0

    review = plan.review(message="e2e: commands and SQL through the door")
    with SandboxClient(namespace=namespace, impersonate=approver(kube, namespace)) as person:
        result = Plan(person, plan.plan_id, namespace).approve(review.digest, timeout=300)
    assert result.committed, result.conditions
    assert originals.read("data/g.txt") == "d1\n"
    assert originals.read("data/out.txt") == "built\n"
    assert originals.read("repos/app/f.txt") == "line2\n"
    assert originals.git("log", "--format=%s", "-n", "5", "main").count("evil") == 0
    assert psql(kube, namespace, "SELECT string_agg(body, ',' ORDER BY body) FROM door_items") == (
        "one,three,two"
    )

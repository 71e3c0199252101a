"""Tier-2 set-up shared by the client tests (tests/client/).

One real etcd + kube-apiserver per session (``tests.apiserver``); per test module one namespace
with the CRDs installed and one operator process (local executor) watching it
(``tests.support.operator``). Sources are real git repositories and real directories.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.approvals import grant_plancommit_rights
from tests.support.operator import Cluster, OperatorProcess, make_dir, make_repo

__all__ = ["ClientEnv", "client_env_for", "make_dir", "make_repo", "three_sources"]


@dataclass
class ClientEnv:
    """A namespace watched by a running operator, and how to reach the API server."""

    cluster: Cluster
    operator: OperatorProcess
    kubeconfig: str

    @property
    def namespace(self) -> str:
        """The namespace every object of the module lives in."""
        return self.cluster.namespace

    @property
    def state_dir(self) -> Path:
        """The local executor's state directory (the actor's operations on local paths)."""
        return self.operator.work_dir / "state"

    def env(self) -> dict[str, str]:
        """Environment for a subprocess (plugin, MCP server): KUBECONFIG, PATH, PYTHONPATH,
        and the local executor's state directory."""
        env = dict(self.cluster.server.env())
        env["SANDBOX_OPERATOR_STATE_DIR"] = str(self.state_dir)
        root = Path(__file__).resolve().parents[2]
        env["PYTHONPATH"] = os.pathsep.join(
            [str(root / "operator"), str(root), env.get("PYTHONPATH", "")]
        )
        return env


def client_env_for(server: Any, work: Path, prefix: str) -> Iterator[ClientEnv]:
    """Yield a :class:`ClientEnv` (fresh namespace, operator started); stop it afterwards.

    On exit every Sandbox and Checkpoint left over is deleted while the operator still runs
    (its finalizers clean the artefacts up), then the operator stops. Case 15: its log must
    show no status field pruned by the schema.
    """
    cluster = Cluster.fresh(server, prefix=prefix)
    operator = OperatorProcess(server, cluster.namespace, work)
    cluster.operator = operator
    operator.start()
    try:
        yield ClientEnv(cluster, operator, str(server.kubeconfig_path))
    finally:
        if operator.process is not None and operator.process.poll() is None:
            cluster.kubectl(
                "delete", "sandboxes,checkpoints,plancommits", "--all", "--timeout=90s", check=False
            )
        operator.stop()
        print(operator.logs()[-8000:])  # shown by pytest when a test failed
    assert "Patching failed with inconsistencies" not in operator.logs()


def three_sources(root: Path) -> dict[str, Path]:
    """A git repository, a directory and a layer directory for the three rollbackable
    strategies (git_worktree, copy_on_write, overlay)."""
    return {
        "repo": make_repo(root / "repo", {"src/app.py": "print('v0')\n", "README.md": "r0\n"}),
        "data": make_dir(root / "data", {"g.txt": "d0\n", "sub/h.txt": "h0\n"}),
        "layer": make_dir(root / "layer", {"o.txt": "o0\n"}),
    }


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The fenced ``python`` code blocks of a Markdown text, in order."""
    return PYTHON_BLOCK.findall(text)


def run_tutorial(blocks: list[str], env: ClientEnv, work: Path) -> str:
    """Run a tutorial's Python blocks, in order, as one script against ``env`` (alice may
    approve), and return its stdout; the script must exit 0 (its output is in the failure)."""
    grant_plancommit_rights(env.cluster)  # alice, the tutorials' approver
    script = work / "tutorial.py"
    script.write_text("\n\n".join(blocks))
    process_env = env.env()
    process_env["SANDBOX_NAMESPACE"] = env.namespace
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=process_env,
        cwd=work,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done.stdout

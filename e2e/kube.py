"""kubectl and helm helpers for the end-to-end suite (tier 3, shared/DESIGN.md "Test tiers").

Everything goes through the ``kubectl`` and ``helm`` command lines with the caller's
``KUBECONFIG``: nothing here knows which cluster it talks to (the local one from
``e2e/cluster up`` or kind from ``e2e/kind.sh``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "charts" / "sandbox-operator"
T = TypeVar("T")


class KubeError(RuntimeError):
    """A kubectl or helm call failed; the message holds the command and its stderr."""


def find_tool(name: str) -> str:
    """Path of ``kubectl`` or ``helm``: ``$SANDBOX_K8S_BIN``, then ``PATH``.

    Raises:
        KubeError: the tool is in neither place.
    """
    bin_dir = os.environ.get("SANDBOX_K8S_BIN")
    if bin_dir and (Path(bin_dir) / name).is_file():
        return str(Path(bin_dir) / name)
    found = shutil.which(name)
    if not found:
        raise KubeError(f'{name} is not on PATH (eval "$(e2e/cluster env)" or set SANDBOX_K8S_BIN)')
    return found


def wait_until(
    what: str, check: Callable[[], T | None], timeout: float, interval: float = 1.0
) -> T:
    """Poll ``check`` until it returns something other than None/False; return that.

    Raises:
        TimeoutError: ``timeout`` seconds passed; the message names ``what``.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class Kube:
    """The cluster behind ``KUBECONFIG``, through kubectl and helm."""

    def __init__(self) -> None:
        if not os.environ.get("KUBECONFIG"):
            raise KubeError(
                "KUBECONFIG is not set: the e2e suite needs a cluster (docs/testing-tiers.md)"
            )
        self.kubectl_path = find_tool("kubectl")
        self.helm_path = find_tool("helm")

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run one command; raise :class:`KubeError` on a non-zero exit when ``check``."""
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise KubeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> str:
        """stdout of ``kubectl ARGS``."""
        return self.run(
            [self.kubectl_path, *args], stdin=stdin, check=check, timeout=timeout
        ).stdout

    def helm(self, *args: str, timeout: float = 300.0) -> str:
        """stdout of ``helm ARGS``."""
        return self.run([self.helm_path, *args], timeout=timeout).stdout

    def json(self, *args: str) -> Any:
        """``kubectl ARGS -o json`` parsed."""
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, namespace: str, *manifests: Mapping[str, Any]) -> None:
        """``kubectl apply`` of the manifests into ``namespace``."""
        text = yaml.safe_dump_all([dict(m) for m in manifests], sort_keys=False)
        self.kubectl("apply", "-n", namespace, "-f", "-", stdin=text)

    def status(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        """``.status`` of one object ({} when it has none yet)."""
        return dict(self.json("get", kind, name, "-n", namespace).get("status") or {})

    def condition(self, kind: str, namespace: str, name: str, type_: str) -> dict[str, Any]:
        """The condition ``type_`` of one object ({} when absent)."""
        for cond in self.status(kind, namespace, name).get("conditions") or []:
            if cond.get("type") == type_:
                return dict(cond)
        return {}

    def wait_phase(
        self, kind: str, namespace: str, name: str, phases: set[str], timeout: float = 180.0
    ) -> dict[str, Any]:
        """Wait until ``.status.phase`` is one of ``phases``; return the status."""

        def check() -> dict[str, Any] | None:
            status = self.status(kind, namespace, name)
            return status if status.get("phase") in phases else None

        try:
            return wait_until(f"{kind}/{name} phase in {sorted(phases)}", check, timeout)
        except TimeoutError as exc:
            raise TimeoutError(
                f"{exc}; last status: {self.status(kind, namespace, name)}"
            ) from None

    def exec(self, namespace: str, pod: str, script: str, *, container: str | None = None) -> str:
        """stdout of ``sh -c SCRIPT`` run in ``pod`` with ``kubectl exec``."""
        args = ["exec", "-n", namespace, pod]
        if container:
            args += ["-c", container]
        return self.kubectl(*args, "--", "sh", "-c", script)

    def names(self, kind: str, namespace: str, selector: str) -> list[str]:
        """Names of the objects of ``kind`` matching a label selector."""
        items = self.json("get", kind, "-n", namespace, "-l", selector).get("items") or []
        return [str(item["metadata"]["name"]) for item in items]

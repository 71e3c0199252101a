"""Which kubeconfig, context and namespace a client uses (kubectl's rules)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_KUBECONFIG = Path("~/.kube/config")


def kubeconfig_path(explicit: str | None) -> str | None:
    """``explicit``, else the first file of ``$KUBECONFIG``, else ``~/.kube/config`` when it
    exists; None means in-cluster configuration."""
    if explicit:
        return explicit
    env = os.environ.get("KUBECONFIG", "")
    for part in env.split(os.pathsep):
        if part and Path(part).expanduser().exists():
            return str(Path(part).expanduser())
    default = DEFAULT_KUBECONFIG.expanduser()
    return str(default) if default.exists() else None


def default_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of ``context`` (or the current context) in the kubeconfig; in a Pod the
    service account's namespace; else ``default``."""
    if kubeconfig:
        import yaml  # only when a kubeconfig is read: ``import sandbox_client`` stays light

        try:
            data = yaml.safe_load(Path(kubeconfig).read_text()) or {}
        except (OSError, yaml.YAMLError):
            data = {}
        wanted = context or data.get("current-context")
        for entry in data.get("contexts") or []:
            if entry.get("name") == wanted:
                return str((entry.get("context") or {}).get("namespace") or "default")
        return "default"
    in_pod = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return in_pod.read_text().strip() or "default"
    except OSError:
        return "default"

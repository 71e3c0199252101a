"""helm for tests, in a private helm home so no test reads or writes the user's configuration.

Imported as ``tests.support.helm`` (the repository root is on ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def run_helm(
    helm: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``helm ARGS`` with ``HELM_{CACHE,CONFIG,DATA}_HOME`` under ``$TMPDIR``; never raises on a
    non-zero exit (the caller asserts); times out after 120 s."""
    home = Path(os.environ.get("TMPDIR", "/tmp")) / "sandbox-operator-helm-home"
    helm_env = dict(env or os.environ)
    for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                     ("HELM_DATA_HOME", "data")):  # fmt: skip
        helm_env[var] = str(home / sub)
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, check=False, env=helm_env, timeout=120
    )

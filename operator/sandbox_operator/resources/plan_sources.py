"""The identity of a Sandbox's original across workspace Pods (the two-phase overlap check).

Every workspace Pod mounts its original at the same path, so the path an executor handle names
says nothing about which directory it is. The Sandbox spec does: the volume (a
PersistentVolumeClaim of the namespace, or a node path) and the sub-path inside it. Two
directory Sandboxes of one plan whose sources are the same volume at the same or nested
sub-paths write the same tree; the two-phase coordinator
(:func:`sandbox_core.plan.two_phase.overlapping_writes`) compares their prepared writes by this
identity before anything is applied. Sandboxes of different volumes never clash.
"""

from __future__ import annotations

import os
import posixpath

from sandbox_operator.executors.base import SandboxTarget

# Strategies whose apply writes files of a directory (git and databases have their own checks).
DIRECTORY_STRATEGIES = frozenset({"copy_on_write", "overlay"})


def source_root(target: SandboxTarget) -> str | None:
    """``pvc:<namespace>/<claim>[/<sub-path>]`` or ``node:<real path>`` for a directory
    Sandbox, else None. Sub-paths are normalised (``a/./b/``, ``a//b`` name ``a/b``; ``..``
    cannot climb above the claim's root), so equal strings mean one directory and a prefix
    followed by ``/`` an enclosing one."""
    if target.strategy not in DIRECTORY_STRATEGIES:
        return None
    source = target.source
    if source.persistent_volume_claim is not None:
        claim = source.persistent_volume_claim
        sub = posixpath.normpath("/" + claim.sub_path).strip("/")
        base = f"pvc:{target.namespace}/{claim.claim_name}"
        return f"{base}/{sub}" if sub else base
    if source.node_path:
        # The local executor runs on the node that holds the path: its real path is the
        # directory (a symlink to another Sandbox's directory is the same tree).
        return "node:" + os.path.realpath(source.node_path)
    return None

"""Approvals bound to the targets' identities (docs/approvals.md, "What the digest binds").

A sandbox's change digest says *what* would be written (content, modes, deletions; for git the
base commit and tree; for a database the statements), not *where*. The same Sandbox object
pointed at another original with the same name - a claim deleted and created again, a
directory replaced by another at the same path - would hash to the same digest, and an approval
given for one original would commit into the other. So the operator binds every sandbox's digest
to the identity of its target before the plan digest is computed, at review and again at
prepare (:class:`BoundHandle`): the digest people approve names the targets, and the commit's
own digest check (``ChangedSinceApproval``) refuses a plan whose targets changed identity.

The identity (:func:`target_identity`) is, one ``key=value`` per line: the Sandbox object
(namespace, name, uid); a claim's uid and normalised sub-path; a node path's real path and its
device and inode; a ``secretRef``'s name and key; and whatever the sandbox itself reports
(``target_identity()`` of the handle, when it has one: a database's system identifier and
name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
from collections.abc import Callable
from typing import Any

from sandbox_operator.executors.base import SandboxTarget


def target_identity(
    target: SandboxTarget, claim_uid: str | None = None, node_stat: os.stat_result | None = None
) -> str:
    """The identity of ``target``'s original, one ``key=value`` per line.

    Args:
        target: the Sandbox as the executor sees it.
        claim_uid: the uid of its source PersistentVolumeClaim (read from the API server), if
            it has one.
        node_stat: ``os.stat`` of its node path's real path, when it could be read.
    """
    lines = [f"sandbox={target.namespace}/{target.name}/{target.uid}"]
    source = target.source
    if source.persistent_volume_claim is not None:
        claim = source.persistent_volume_claim
        sub = posixpath.normpath("/" + claim.sub_path).strip("/")
        lines.append(f"claim={target.namespace}/{claim.claim_name}/{claim_uid or ''}")
        lines.append(f"subPath={sub}")
    if source.node_path:
        lines.append(f"nodePath={os.path.realpath(source.node_path)}")
        if node_stat is not None:
            lines.append(f"inode={node_stat.st_dev}:{node_stat.st_ino}")
    if source.secret_ref is not None:
        lines.append(f"secret={target.namespace}/{source.secret_ref.name}/{source.secret_ref.key}")
    return "\n".join(lines)


def bind_digest(identity: str, digest: str) -> str:
    """``"sha256:<hex>"`` over the target identity and a sandbox's change digest."""
    payload = f"sandbox-target\0{identity}\0{digest}".encode()
    return "sha256:" + hashlib.sha256(payload).hexdigest()


class BoundHandle:
    """A plan participant whose ``review`` and ``prepare`` digests name its target.

    ``identity`` is called at each review and prepare (so a target that changed identity in
    between gives another digest); the handle's own ``target_identity()``, when it has one, is
    added. Everything else is the wrapped handle's.
    """

    def __init__(self, wrapped: Any, identity: Callable[[], str]) -> None:
        self.wrapped = wrapped
        self._identity = identity

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def _read_identity(self) -> str:
        identity = self._identity()
        own = getattr(self.wrapped, "target_identity", None)
        if callable(own):
            identity += "\n" + str(own())
        return identity

    def review(self) -> Any:
        """The wrapped review with its digest bound to the target."""
        identity = self._read_identity()
        summary = self.wrapped.review()
        return dataclasses.replace(summary, digest=bind_digest(identity, summary.digest))

    def prepare(self, txid: str, message: str | None = None) -> Any:
        """The wrapped prepare with its digest bound to the target (equal to the review's while
        neither the changes nor the target changed). The identity is read first: when it
        cannot be read nothing is prepared."""
        identity = self._read_identity()
        prepared = self.wrapped.prepare(txid, message)
        return dataclasses.replace(prepared, digest=bind_digest(identity, prepared.digest))

"""kopf's diff-base, kept in each object's status beside what the handler writes.

kopf remembers the last handled spec (the "diff-base") to tell a change from an echo. Kept in an
annotation, it costs every handled object a PATCH of the object of its own besides the
``/status`` PATCH of the handler's outcome (a status subresource takes no metadata, the object
takes no status). Kept in ``status.lastHandledConfiguration`` (declared in every CRD, so the
schema never prunes it: case 15), the outcome and the diff-base land in one ``/status`` request,
and an operator killed between kopf's two writes can no longer leave an object marked handled
with no status.

Objects handled by an earlier operator hold the diff-base in the annotation
``sandbox.cleveragents.io/last-handled-configuration``: it is read when the status has none but
holds that operator's outcome (a phase), so an upgrade never handles an existing object as new;
the next diff-base stored removes it. An object re-created from an export keeps its annotations
but not its status: it is new, whatever its annotation says (docs/api-evolution.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf

from sandbox_api.models import GROUP, PLAN_LABEL

STATUS_FIELD = "lastHandledConfiguration"
LEGACY_KEY = "last-handled-configuration"  # the annotation's key under GROUP, read for upgrades

# What kopf's essence keeps of an object besides the top-level fields other than metadata and
# status (ownerReferences and kind: kopf's storage keys look at them).
_ESSENCE_METADATA = ("labels", "annotations", "ownerReferences")


class StatusDiffBase(kopf.StatusDiffBaseStorage):
    """kopf's diff-base in ``status.lastHandledConfiguration`` (a JSON text); read from an
    earlier operator's annotation when the status has none but a phase, which the first
    diff-base stored here removes.

    The essence is kopf's own (``kopf.AnnotationsDiffBaseStorage.build``, so an object handled
    before the move compares equal), built from spec, labels and annotations only, and without
    the label ``sandbox.cleveragents.io/plan-id``: no handler reacts to it, and an object that
    gets it after it was handled must not look changed.
    """

    def __init__(self) -> None:
        super().__init__(field=f"status.{STATUS_FIELD}")
        self._legacy = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key=LEGACY_KEY)

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        fields = list(extra_fields or ())
        essence = self._legacy.build(body=_essential(body, fields), extra_fields=fields)
        return _without_plan_label(essence)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        found = super().fetch(body=body)
        if found is None and body.status.get("phase"):
            found = self._legacy.fetch(body=body)
        # Diff-bases stored by earlier operators may hold the label: compare them without it.
        return None if found is None else _without_plan_label(found)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        super().store(body=body, patch=patch, essence=essence)
        # An earlier operator's annotation goes with the first diff-base in the status: once
        # stale, it must never be read (one object PATCH, once per upgraded object).
        for key in self._legacy.make_keys(LEGACY_KEY, body=body):
            if key in body.metadata.annotations:
                patch.metadata.annotations[key] = None


def _essential(body: kopf.Body, extra_fields: list[Any]) -> kopf.Body:
    """``body`` without what kopf's diff-base drops anyway: status and the system metadata.

    kopf deep-copies the whole body (status, managedFields) on every processing cycle before it
    throws those parts away; copying only the kept parts is the same essence for less CPU. Extra
    fields outside spec, labels and annotations (none today) keep the whole body.
    """
    for field in extra_fields:
        path = field.split(".") if isinstance(field, str) else list(field)
        if path[0] in ("status", "metadata") and path[:2] not in (
            ["metadata", "labels"],
            ["metadata", "annotations"],
        ):
            return body
    metadata = body.get("metadata") or {}
    light: dict[str, Any] = {k: v for k, v in body.items() if k not in ("metadata", "status")}
    light["metadata"] = {k: metadata[k] for k in _ESSENCE_METADATA if k in metadata}
    return kopf.Body(cast(kopf.RawBody, light))


def _without_plan_label(essence: kopf.BodyEssence) -> kopf.BodyEssence:
    labels = essence.get("metadata", {}).get("labels")
    if isinstance(labels, dict) and PLAN_LABEL in labels:
        del labels[PLAN_LABEL]
        if not labels:
            del essence["metadata"]["labels"]
        if not essence["metadata"]:
            del essence["metadata"]
    return essence

"""The labels and annotations every new object gets, in the PATCH of kopf's finalizer.

One event handler for all three kinds (id ``metadata``): a Sandbox's plan-id label
(:func:`~sandbox_operator.resources.sandbox.plan_label_patch`) and kopf's marker on every object.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import kopf

from sandbox_api.models import CHECKPOINT_PLURAL, GROUP, PLANCOMMIT_PLURAL, SANDBOX_PLURAL, VERSION
from sandbox_operator.resources.sandbox import plan_label_patch

# kopf's own mark on an object whose annotations hold this operator's kopf records: its
# progress storage writes it, in a PATCH of its own, the first time it stores anything.
KOPF_MARKER = f"{GROUP}/kopf-managed"


def missing_metadata(body: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """The labels and annotations the operator puts on every new object that it lacks
    (``{}`` when none is missing): the plan-id label of a Sandbox, kopf's marker."""
    metadata = body.get("metadata") or {}
    missing: dict[str, dict[str, str]] = {}
    if body.get("kind") == "Sandbox" and (labels := plan_label_patch(body)):
        missing["labels"] = labels
    if KOPF_MARKER not in (metadata.get("annotations") or {}):
        missing["annotations"] = {KOPF_MARKER: "yes"}
    return missing


def _metadata_missing(event: kopf.RawEvent, body: kopf.Body, **_: Any) -> bool:
    deleting = event["type"] == "DELETED" or body.metadata.get("deletionTimestamp")
    return not deleting and bool(missing_metadata(body))


@kopf.on.event(GROUP, VERSION, SANDBOX_PLURAL, id="metadata", when=_metadata_missing)
@kopf.on.event(GROUP, VERSION, CHECKPOINT_PLURAL, id="metadata", when=_metadata_missing)
@kopf.on.event(GROUP, VERSION, PLANCOMMIT_PLURAL, id="metadata", when=_metadata_missing)
async def set_metadata(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Set :func:`missing_metadata` in the PATCH that adds kopf's finalizer.

    kopf runs event handlers in every processing cycle, also in the one that only adds the
    finalizer. The change is a transformation function, as kopf's finalizer is: both become one JSON
    patch guarded by the object's resourceVersion (a merge patch beside it would be a second
    request). So a new object gets its plan-id label and kopf's marker without a write of their own
    (for throughput), and one made before gets them on its first event. ``async``: a dictionary
    lookup needs no worker thread.
    """
    patch.fns.append(functools.partial(_merge_metadata, missing=missing_metadata(body)))


def _merge_metadata(body: dict[str, Any], missing: dict[str, dict[str, str]]) -> None:
    metadata = body.setdefault("metadata", {})
    for field, values in missing.items():
        metadata.setdefault(field, {}).update(values)

"""Child objects the operator may act on: only those whose controller is the owner's uid.

Kubernetes names are not identities: a name can be taken by an object someone else made, or
by a child of another owner. So before the operator adopts or deletes a child it reads the
child's metadata and compares the ``uid`` of its controller ownerReference (the one
``kopf.adopt`` writes, ``controller: true``) with the owner's uid:

- create: a 409 (the name exists) is "made by an earlier attempt" only when that object's
  controller is the owner; otherwise :class:`~sandbox_operator.errors.ChildNameTaken` and
  nothing is adopted;
- delete: only an object the owner controls, and with ``preconditions.uid`` set to the uid that
  was checked, so an object made again under the same name in between is never deleted.

Reads ask for metadata only (``PartialObjectMetadata``): a Secret's data never reaches the
operator (the ``get`` right is still needed). Source of the rule: the API conventions' owner
references, and the security review of child objects (docs/operator-design.md, "Child objects").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from sandbox_operator.kube.api import Api

logger = logging.getLogger(__name__)

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


@dataclass(frozen=True)
class Kind:
    """Where objects of one kind live: ``<group path>/namespaces/<ns>/<plural>/<name>``."""

    name: str
    group_path: str
    plural: str

    def path(self, namespace: str, name: str = "") -> str:
        """API path of the collection (no ``name``) or of one object."""
        base = f"{self.group_path}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{name}" if name else base


KINDS = {
    kind.name: kind
    for kind in (
        Kind("Pod", "/api/v1", "pods"),
        Kind("Secret", "/api/v1", "secrets"),
        Kind("PersistentVolumeClaim", "/api/v1", "persistentvolumeclaims"),
        Kind("NetworkPolicy", "/apis/networking.k8s.io/v1", "networkpolicies"),
    )
}


def controller_uid(metadata: Mapping[str, Any] | None) -> str:
    """The ``uid`` of the controller ownerReference of an object's ``metadata`` (camelCase, as
    the API returns it); ``""`` when it has none."""
    for ref in (metadata or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


def is_controlled_by(metadata: Mapping[str, Any] | None, owner_uid: str) -> bool:
    """True when the object's controller ownerReference names ``owner_uid`` (never for "")."""
    return bool(owner_uid) and controller_uid(metadata) == owner_uid


def holder(kind: str, metadata: Mapping[str, Any]) -> str:
    """Who holds a name, in words for a condition: ``Secret ns/name (controller uid U)``."""
    uid = controller_uid(metadata)
    by = f"controlled by uid {uid}" if uid else "with no controller"
    return f"{kind} {metadata.get('namespace')}/{metadata.get('name')} ({by})"


def read_metadata(api: Api, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """``metadata`` of one object (metadata only: no Secret data), or None when it is absent.

    Raises:
        ApiException: any error but 404 (403 without the ``get`` right).
    """
    request = api.api_client.param_serialize(
        method="GET",
        resource_path=KINDS[kind].path(namespace, name),
        header_params={"Accept": METADATA_ONLY},
        auth_settings=["BearerToken"],
    )
    response = api.api_client.call_api(*request)
    data = response.read()  # type: ignore[no-untyped-call]
    if response.status == 404:
        return None
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=None, data=None)
    return cast(dict[str, Any], json.loads(data).get("metadata") or {})


def create(api: Api, manifest: dict[str, Any]) -> bool:
    """Create ``manifest`` (already adopted); False when its name exists (409).

    Raises:
        ApiException: any error but 409.
    """
    metadata = manifest["metadata"]
    path = KINDS[manifest["kind"]].path(metadata["namespace"])
    try:
        api.raw("POST", path, {}, manifest)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def delete_controlled(api: Api, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
    """Delete ``kind`` ``name`` only when ``owner_uid`` controls it, with ``preconditions.uid``.

    Returns True when a delete was sent; False when absent, controlled by another or replaced
    between the read and the delete (409 on the precondition): such objects are left alone and
    logged.

    Raises:
        ApiException: any other API error.
    """
    metadata = read_metadata(api, kind, namespace, name)
    if metadata is None:
        return False
    if not is_controlled_by(metadata, owner_uid):
        logger.warning(
            "not deleting %s: its controller is not uid %s", holder(kind, metadata), owner_uid
        )
        return False
    options = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": str(metadata.get("uid") or "")},
    }
    try:
        api.raw("DELETE", KINDS[kind].path(namespace, name), {}, options)
    except ApiException as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True

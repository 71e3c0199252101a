"""Thin synchronous wrappers over the Kubernetes API for what kopf does not patch itself.

kopf applies a handler's ``patch`` only after the handler returns; the PlanCommit journal must be
on the API server *before* each side effect, so journal writes go through here directly.
Handlers run in kopf's thread pool, so blocking calls are fine.
"""

from __future__ import annotations

import base64
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sandbox_operator import redaction
from sandbox_operator.models import GROUP, VERSION


def load_config() -> None:
    """In-cluster config when running in a Pod, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


class Api:
    """The few API calls the operator makes outside kopf (created after :func:`load_config`)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api_client = api_client or client.ApiClient()
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        """The object, fresh from the API server.

        Raises:
            ApiException: 404 when it is gone.
        """
        return cast(
            dict[str, Any],
            self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name),
        )

    def list(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        """All objects of ``plural`` in ``namespace``."""
        found = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
        return list(cast(dict[str, Any], found).get("items") or [])

    def patch_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch ``.status`` through the status subresource (lists are replaced whole).

        Raises:
            ApiException: 404 when the object is gone; 422 when the schema refuses the value.
        """
        return cast(
            dict[str, Any],
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, {"status": redaction.scrub(status)}
            ),
        )

    def delete(self, plural: str, namespace: str, name: str) -> bool:
        """Delete an object; False when it was already gone."""
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def secret_value(self, namespace: str, name: str, key: str) -> str:
        """Decoded ``data[key]`` of a Secret.

        Raises:
            ApiException: 404 when the Secret is missing.
            KeyError: the Secret has no such key.
        """
        secret = self.core.read_namespaced_secret(name, namespace)
        data = secret.data or {}
        if key not in data:
            raise KeyError(f"secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(data[key]).decode("utf-8")

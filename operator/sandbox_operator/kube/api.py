"""Thin synchronous wrappers over the Kubernetes API for what kopf does not patch itself.

kopf applies a handler's ``patch`` only after the handler returns; the PlanCommit journal must be
on the API server *before* each side effect, so journal writes go through here directly.
Handlers run in kopf's thread pool, so blocking calls are fine. Children the operator creates
itself (the workspace Pod and its Secret, claim and NetworkPolicy) are adopted here too
(:func:`adopt`), so the executors need no kopf of their own.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from sandbox_api.models import GROUP, VERSION
from sandbox_operator.kube import redaction
from sandbox_operator.kube.fence import FencedApiClient


def load_config() -> None:
    """In-cluster config when running in a Pod, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    # A throttled (429) or failing (5xx) API server is retried here, honouring Retry-After,
    # instead of failing a journal write mid-saga (the API fault proxy test checks it). The
    # writes made here are merge patches and creates whose 409 is handled: safe to repeat.
    defaults = client.Configuration.get_default_copy()
    defaults.retries = Retry(
        total=6, backoff_factor=0.2, status_forcelist=(429, 500, 502, 503, 504),
        allowed_methods=None, respect_retry_after_header=True, raise_on_status=False,
    )  # fmt: skip
    client.Configuration.set_default(defaults)


def adopt(manifest: dict[str, Any], owner: Mapping[str, Any]) -> None:
    """Make ``owner`` (an object's body) the owner of the child ``manifest``, in place
    (``kopf.adopt``: an ownerReference, so the child is garbage-collected with its owner; the
    owner's namespace and labels where the manifest has none)."""
    kopf.adopt(manifest, owner=cast(kopf.Body, owner))


class Api:
    """The few API calls the operator makes outside kopf (created after :func:`load_config`)."""

    def __init__(self, api_client: client.ApiClient | None = None) -> None:
        self.api_client = api_client or FencedApiClient()
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

    def namespace(self, name: str) -> dict[str, Any] | None:
        """The Namespace ``name`` as plain JSON (camelCase), or None when it does not exist.

        Raises:
            ApiException: any other API error (403 without RBAC on namespaces).
        """
        try:
            found = self.core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        plain = self.api_client.sanitize_for_serialization(found)  # type: ignore[no-untyped-call]
        return cast(dict[str, Any], plain)

    def post_event(self, namespace: str, event: dict[str, Any]) -> None:
        """Create one core/v1 Event (plain JSON body, see ``events.build_event``).

        Raises:
            ApiException: 403 "being terminated" in a namespace being deleted, and the like.
        """
        self.raw("POST", "/api/v1/namespaces/{namespace}/events", {"namespace": namespace}, event)

    def raw(
        self, method: str, path: str, path_params: dict[str, str], body: dict[str, Any]
    ) -> None:
        """One request with a plain JSON body; the reply is checked, not parsed.

        The generated client validates a body into its pydantic model and parses every reply into
        another: for an Event per Sandbox that was most of the poster's CPU. Same client,
        configuration, token and urllib3 retry as the other calls.

        Raises:
            ApiException: any reply other than 2xx.
        """
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            path_params=path_params,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*request)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)

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

"""The client's one seam to a Kubernetes API library, written in both flavours side by side.

The client (:mod:`sandbox_client._async.client`, and the sync copy hack/unasync.py generates from
it) and the pod-proxy transports of :mod:`sandbox_client.agent_files` reach the API server only
through :class:`AsyncKube` (``kubernetes_asyncio``) and :class:`Kube` (the official
``kubernetes`` client). The two classes have the same methods, arguments, results and errors; all
that differs between the two libraries lives here, so the generated client stays mechanical:

- the configuration: :class:`Kube` loads it when it is made (``ConfigError`` from the client's
  constructor); :class:`AsyncKube` on first use (``kubernetes_asyncio`` loads it with a
  coroutine), once, under a lock;
- which exceptions mean "unreachable" (``urllib3`` / ``aiohttp`` errors) and which one a quiet
  watch ends with (``urllib3``'s read timeout / ``TimeoutError``);
- how a watch is streamed and stopped, how a merge patch is sent, how a request reaches a Pod
  through the API server's proxy (the generated code differs between client versions).

Both libraries are imported on first use, never with this module: ``import sandbox_client``
stays light (either Kubernetes client takes about 0.3 s to import).

Errors: every method raises only :mod:`sandbox_client.errors` types (the API status's typed
error; ``SandboxClientError`` with reason ``ApiUnreachable`` or ``ConfigError``), and a watch
raises :class:`GoneError` when its resourceVersion expired (the caller lists again).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, cast

from sandbox_client.errors import (
    OperationFailedError,
    SandboxClientError,
    from_api_exception,
)
from sandbox_client.models import GROUP, VERSION

if TYPE_CHECKING:
    import asyncio

    import kubernetes.client
    import kubernetes_asyncio.client

Listing = dict[str, Any]
"""A list reply: ``items`` (raw objects) and ``metadata.resourceVersion``."""


class GoneError(Exception):
    """A watch's resourceVersion is too old (HTTP 410 Gone): list again, then watch."""


def _reply_of(exc: Any, method: str) -> tuple[int, bytes]:
    """The reply an ``ApiException`` carries (a non-2xx status), or ``IOError`` without one."""
    if not exc.status:
        raise OperationFailedError("IOError", f"agent {method}: {exc.reason}") from None
    body = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
    return int(exc.status), body


def _payload(headers: dict[str, str], body: bytes | None) -> Any:
    """The body as the Kubernetes libraries take it: a JSON body as its value (they serialize
    a JSON content type themselves), any other as its bytes."""
    if body is not None and headers.get("Content-Type") == "application/json":
        return json.loads(body)
    return body


def _secret_token(secret: Any, key: str) -> str | None:
    encoded = (secret.data or {}).get(key)
    return base64.b64decode(encoded).decode().strip() if encoded else None


# -- kubernetes_asyncio -------------------------------------------------------------------------


@asynccontextmanager
async def _async_translated() -> AsyncIterator[None]:
    """Convert ``kubernetes_asyncio``'s exceptions into the client's typed errors."""
    import aiohttp
    from kubernetes_asyncio.client.exceptions import ApiException

    try:
        yield
    except SandboxClientError:
        raise  # already typed (WaitTimeoutError is an OSError through TimeoutError)
    except ApiException as exc:
        raise from_api_exception(exc.status, exc.reason, exc.body) from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise SandboxClientError("ApiUnreachable", str(exc)) from exc


class AsyncKube:
    """The API server through ``kubernetes_asyncio``; the configuration is loaded on first use.

    Args:
        kubeconfig: path of a kubeconfig file; None: the in-cluster service account.
        context: kubeconfig context; default the current one.
        api_client: a ready ``kubernetes_asyncio.client.ApiClient`` (then the two above are
            ignored).
        impersonate: act as this user (kubectl's ``--as``: the ``Impersonate-User`` header;
            the credentials must be allowed to impersonate).
    """

    def __init__(
        self,
        kubeconfig: str | None,
        context: str | None,
        api_client: kubernetes_asyncio.client.ApiClient | None = None,
        impersonate: str | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.context = context
        self.api_client = api_client
        self.impersonate = impersonate
        self._lock: asyncio.Lock | None = None

    @classmethod
    def of(cls, api: AsyncKube | kubernetes_asyncio.client.ApiClient) -> AsyncKube:
        """``api`` itself, or a seam over that ready ``ApiClient``."""
        return api if isinstance(api, AsyncKube) else cls(None, None, api)

    async def api(self) -> kubernetes_asyncio.client.ApiClient:
        """The ``ApiClient`` (made on the first call).

        Raises:
            SandboxClientError: reason ``ConfigError`` when no configuration can be loaded.
        """
        if self._lock is None:
            import asyncio  # here, not with the module: the blocking client never needs it

            self._lock = asyncio.Lock()  # made in the loop that uses it
        async with self._lock:
            if self.api_client is None:
                from kubernetes_asyncio import client as k8s
                from kubernetes_asyncio import config as k8s_config

                try:
                    if self.kubeconfig is not None:
                        self.api_client = await k8s_config.new_client_from_config(
                            config_file=self.kubeconfig, context=self.context
                        )
                    else:
                        k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                        self.api_client = k8s.ApiClient()
                except (k8s_config.ConfigException, OSError) as exc:
                    raise SandboxClientError("ConfigError", str(exc)) from exc
            if self.impersonate:
                self.api_client.set_default_header("Impersonate-User", self.impersonate)
            return self.api_client

    async def _custom(self) -> Any:
        from kubernetes_asyncio import client as k8s

        return k8s.CustomObjectsApi(await self.api())

    async def close(self) -> None:
        """Close the HTTP session (a later call opens a new one)."""
        if self.api_client is not None:
            await self.api_client.close()
            self.api_client = None

    async def read(self, plural: str, name: str, namespace: str) -> dict[str, Any]:
        """The object ``plural/name``; ``NotFoundError`` when it does not exist."""
        custom = await self._custom()
        async with _async_translated():
            found = await custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        return cast(dict[str, Any], found)

    async def listing(self, plural: str, namespace: str, field_selector: str = "") -> Listing:
        """The list reply of ``plural`` (only the objects ``field_selector`` selects)."""
        custom = await self._custom()
        async with _async_translated():
            found = await custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, field_selector=field_selector or None
            )
        return cast(Listing, found)

    async def create(self, plural: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        """Create ``body`` (strict field validation); the stored object."""
        custom = await self._custom()
        async with _async_translated():
            found = await custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body, field_validation="Strict"
            )
        return cast(dict[str, Any], found)

    async def patch(
        self, plural: str, name: str, patch: dict[str, Any], namespace: str
    ) -> dict[str, Any]:
        """JSON merge patch of ``plural/name``; the stored object."""
        custom = await self._custom()
        async with _async_translated():
            # Passed through **kwargs at run time; without it a dict body goes out as a JSON
            # patch (the first content type the generated code lists).
            found = await custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
                _content_type="application/merge-patch+json",
            )
        return cast(dict[str, Any], found)

    async def delete(self, plural: str, name: str, namespace: str) -> None:
        """Ask for the deletion of ``plural/name``; ``NotFoundError`` when it is gone."""
        custom = await self._custom()
        async with _async_translated():
            await custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)

    async def events(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """The ``v1 Event`` dicts (camelCase) about the object ``name``."""
        from kubernetes_asyncio import client as k8s

        api = await self.api()
        async with _async_translated():
            found = await k8s.CoreV1Api(api).list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}"
            )
        data = api.sanitize_for_serialization(found)
        return list(cast(dict[str, Any], data).get("items") or [])

    async def watch(
        self, plural: str, namespace: str, arguments: dict[str, Any]
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events of one watch of ``plural`` (``arguments``: resource version, timeouts,
        field selector); ends when the server ends the watch or it stays quiet too long.

        Raises:
            GoneError: the resource version expired.
        """
        import aiohttp
        from kubernetes_asyncio import watch as k8s_watch
        from kubernetes_asyncio.client.exceptions import ApiException

        custom = await self._custom()
        try:
            async with k8s_watch.Watch() as watcher:
                stream = watcher.stream(
                    custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    **arguments,
                )
                async for event in stream:
                    yield event
        except ApiException as exc:
            if exc.status == 410:
                raise GoneError(str(exc.reason)) from exc
            raise from_api_exception(exc.status, exc.reason, exc.body) from exc
        except TimeoutError:
            return  # a quiet watch: the caller's deadline decides
        except (aiohttp.ClientError, OSError) as exc:
            raise SandboxClientError("ApiUnreachable", str(exc)) from exc

    async def whoami(self) -> dict[str, Any]:
        """The identity the API server authenticates for these credentials: the
        ``status.userInfo`` of a SelfSubjectReview (authentication.k8s.io/v1; ``username``,
        ``uid``, ``groups``, ``extra``), what ``kubectl auth whoami`` prints.

        Raises:
            RefusedError: ``Forbidden`` (the server refuses self-reviews).
        """
        from kubernetes_asyncio import client as k8s

        api = await self.api()
        async with _async_translated():
            found = await k8s.AuthenticationV1Api(api).create_self_subject_review(
                k8s.V1SelfSubjectReview(api_version="authentication.k8s.io/v1")
            )
        data = cast(dict[str, Any], api.sanitize_for_serialization(found))
        return dict((data.get("status") or {}).get("userInfo") or {})

    async def secret_token(self, name: str, namespace: str, key: str) -> str | None:
        """The decoded ``key`` of Secret ``name`` (None when it has none).

        Raises:
            NotFoundError: no such Secret. RefusedError: ``Forbidden`` (RBAC).
        """
        from kubernetes_asyncio import client as k8s

        api = await self.api()
        async with _async_translated():
            secret = await k8s.CoreV1Api(api).read_namespaced_secret(name, namespace)
        return _secret_token(secret, key)

    async def proxy(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | None,
        timeout_seconds: float,
    ) -> tuple[int, bytes]:
        """One request to the API server ``path`` (a pod proxy path): its status and body,
        whatever the status.

        Raises:
            OperationFailedError: ``IOError``, the API server cannot be reached.
        """
        import aiohttp
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.api()
        try:
            response = await _proxy_call(api, method, path, query, headers, body, timeout_seconds)
            try:
                return int(response.status), await response.read()
            finally:
                response.release()
        except ApiException as exc:
            return _reply_of(exc, method)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {method} via the API server: {type(exc).__name__}"
            ) from None

    async def proxy_stream(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | None,
        timeout_seconds: float,
    ) -> AsyncIterator[tuple[int, bytes]]:
        """As :meth:`proxy`, the body as it arrives: (status, chunk) pairs; a refusal is one
        pair with the whole body. ``timeout_seconds`` bounds each read, not the whole reply.

        Raises:
            OperationFailedError: ``IOError``, the API server cannot be reached.
        """
        import aiohttp
        from kubernetes_asyncio.client.exceptions import ApiException

        api = await self.api()
        try:
            response = await _proxy_call(
                api, method, path, query, headers, body,
                aiohttp.ClientTimeout(sock_read=timeout_seconds),
            )  # fmt: skip
        except ApiException as exc:
            yield _reply_of(exc, method)
            return
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {method} via the API server: {type(exc).__name__}"
            ) from None
        try:
            async for data in response.content.iter_any():
                yield int(response.status), bytes(data)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {method} via the API server: {type(exc).__name__}"
            ) from None
        finally:
            response.release()


async def _proxy_call(
    api: Any,
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    body: bytes | None,
    request_timeout: Any,
) -> Any:
    """One pod-proxy request through ``api`` (kubernetes_asyncio), its body not read yet."""
    return await api.call_api(
        path, method, query_params=query, header_params=headers, body=_payload(headers, body),
        auth_settings=["BearerToken"], _preload_content=False, _request_timeout=request_timeout,
    )  # fmt: skip


# -- kubernetes (blocking) ----------------------------------------------------------------------


@contextmanager
def _translated() -> Iterator[None]:
    """Convert the ``kubernetes`` client's exceptions into the client's typed errors."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except SandboxClientError:
        raise  # already typed (WaitTimeoutError is an OSError through TimeoutError)
    except ApiException as exc:
        raise from_api_exception(exc.status, exc.reason, exc.body) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise SandboxClientError("ApiUnreachable", str(exc)) from exc


class Kube:
    """:class:`AsyncKube`, blocking, on the official ``kubernetes`` client; the configuration
    is loaded when it is made.

    Raises:
        SandboxClientError: reason ``ConfigError`` when no configuration can be loaded.
    """

    def __init__(
        self,
        kubeconfig: str | None,
        context: str | None,
        api_client: kubernetes.client.ApiClient | None = None,
        impersonate: str | None = None,
    ) -> None:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        self.kubeconfig = kubeconfig
        self.context = context
        if api_client is None:
            try:
                if kubeconfig is not None:
                    api_client = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                        config_file=kubeconfig, context=context
                    )
                else:
                    k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                    api_client = k8s.ApiClient()
            except (k8s_config.ConfigException, OSError) as exc:
                raise SandboxClientError("ConfigError", str(exc)) from exc
        self.impersonate = impersonate
        if impersonate:
            api_client.set_default_header("Impersonate-User", impersonate)
        self.api_client: kubernetes.client.ApiClient = api_client
        self._custom = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)

    @classmethod
    def of(cls, api: Kube | kubernetes.client.ApiClient) -> Kube:
        """As :meth:`AsyncKube.of`."""
        return api if isinstance(api, Kube) else cls(None, None, api)

    def api(self) -> kubernetes.client.ApiClient:
        """As :meth:`AsyncKube.api` (made with this object)."""
        return self.api_client

    def close(self) -> None:
        """Release the connection pool."""
        self.api_client.close()  # type: ignore[no-untyped-call]

    def read(self, plural: str, name: str, namespace: str) -> dict[str, Any]:
        """As :meth:`AsyncKube.read`."""
        with _translated():
            found = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        return cast(dict[str, Any], found)

    def listing(self, plural: str, namespace: str, field_selector: str = "") -> Listing:
        """As :meth:`AsyncKube.listing`."""
        with _translated():
            found = self._custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, field_selector=field_selector or None
            )
        return cast(Listing, found)

    def create(self, plural: str, body: dict[str, Any], namespace: str) -> dict[str, Any]:
        """As :meth:`AsyncKube.create`."""
        with _translated():
            found = self._custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body, field_validation="Strict"
            )
        return cast(dict[str, Any], found)

    def patch(
        self, plural: str, name: str, patch: dict[str, Any], namespace: str
    ) -> dict[str, Any]:
        """As :meth:`AsyncKube.patch` (this client sends a dict body as a merge patch)."""
        with _translated():
            found = self._custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, patch
            )
        return cast(dict[str, Any], found)

    def delete(self, plural: str, name: str, namespace: str) -> None:
        """As :meth:`AsyncKube.delete`."""
        with _translated():
            self._custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)

    def whoami(self) -> dict[str, Any]:
        """As :meth:`AsyncKube.whoami`."""
        from kubernetes import client as k8s

        with _translated():
            found = k8s.AuthenticationV1Api(self.api_client).create_self_subject_review(
                k8s.V1SelfSubjectReview(api_version="authentication.k8s.io/v1")
            )
        serialize = self.api_client.sanitize_for_serialization
        data = cast(dict[str, Any], serialize(found))  # type: ignore[no-untyped-call]
        return dict((data.get("status") or {}).get("userInfo") or {})

    def events(self, name: str, namespace: str) -> list[dict[str, Any]]:
        """As :meth:`AsyncKube.events`."""
        with _translated():
            found = self._core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.name={name}"
            )
        data = self.api_client.sanitize_for_serialization(found)  # type: ignore[no-untyped-call]
        return list(cast(dict[str, Any], data).get("items") or [])

    def watch(
        self, plural: str, namespace: str, arguments: dict[str, Any]
    ) -> Generator[dict[str, Any], None, None]:
        """As :meth:`AsyncKube.watch`."""
        import urllib3
        from kubernetes import watch as k8s_watch
        from kubernetes.client.exceptions import ApiException

        watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]
        try:
            yield from watcher.stream(  # type: ignore[no-untyped-call]
                self._custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                **arguments,
            )
        except ApiException as exc:
            if exc.status == 410:
                raise GoneError(str(exc.reason)) from exc
            raise from_api_exception(exc.status, exc.reason, exc.body) from exc
        except urllib3.exceptions.ReadTimeoutError:
            return  # a quiet watch: the caller's deadline decides
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SandboxClientError("ApiUnreachable", str(exc)) from exc
        finally:
            watcher.stop()  # type: ignore[no-untyped-call]

    def secret_token(self, name: str, namespace: str, key: str) -> str | None:
        """As :meth:`AsyncKube.secret_token`."""
        with _translated():
            secret = self._core.read_namespaced_secret(name, namespace)
        return _secret_token(secret, key)

    def proxy(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | None,
        timeout_seconds: float,
    ) -> tuple[int, bytes]:
        """As :meth:`AsyncKube.proxy` (one HTTPS request to the API server)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        client: Any = self.api_client
        payload = _payload(headers, body)
        try:
            if hasattr(client, "param_serialize"):  # kubernetes >= 31
                verb, url, headers, body, _ = client.param_serialize(
                    method=method, resource_path=path, query_params=query,
                    header_params=headers, body=payload, auth_settings=["BearerToken"],
                )  # fmt: skip
                response = client.call_api(
                    verb, url, header_params=headers, body=body,
                    _request_timeout=timeout_seconds,
                )  # fmt: skip
                response.read()
                return int(response.status), bytes(response.data or b"")
            raw = client.call_api(
                path, method, query_params=query, header_params=headers,
                body=payload, auth_settings=["BearerToken"], _preload_content=False,
                _return_http_data_only=True, _request_timeout=timeout_seconds,
            )  # fmt: skip
            return int(raw.status), bytes(raw.data or b"")
        except ApiException as exc:  # older clients raise for a non-2xx reply
            return _reply_of(exc, method)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {method} via the API server: {type(exc).__name__}"
            ) from None

    def proxy_stream(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: bytes | None,
        timeout_seconds: float,
    ) -> Iterator[tuple[int, bytes]]:
        """As :meth:`AsyncKube.proxy_stream` (``urllib3``'s streamed response)."""
        import urllib3
        from kubernetes.client.exceptions import ApiException

        client: Any = self.api_client
        payload = _payload(headers, body)
        try:
            if hasattr(client, "param_serialize"):  # kubernetes >= 31
                verb, url, headers, body, _ = client.param_serialize(
                    method=method, resource_path=path, query_params=query,
                    header_params=headers, body=payload, auth_settings=["BearerToken"],
                )  # fmt: skip
                raw = client.call_api(
                    verb, url, header_params=headers, body=body,
                    _request_timeout=(timeout_seconds, timeout_seconds),
                ).response  # fmt: skip
            else:
                raw = client.call_api(
                    path, method, query_params=query, header_params=headers,
                    body=payload, auth_settings=["BearerToken"], _preload_content=False,
                    _return_http_data_only=True,
                    _request_timeout=(timeout_seconds, timeout_seconds),
                )  # fmt: skip
        except ApiException as exc:
            yield _reply_of(exc, method)
            return
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {method} via the API server: {type(exc).__name__}"
            ) from None
        try:
            for data in raw.stream(64 * 1024):
                yield int(raw.status), bytes(data)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise OperationFailedError(
                "IOError", f"agent {method} via the API server: {type(exc).__name__}"
            ) from None
        finally:
            raw.release_conn()

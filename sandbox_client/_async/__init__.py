"""The client's one hand-written source: :mod:`sandbox_client._async.client`.

The blocking client, :mod:`sandbox_client._sync.client`, is generated from it by
``hack/unasync.py`` (coroutines become functions, ``Async`` names their blocking twins,
``kubernetes_asyncio`` the official ``kubernetes`` client) and the test command checks that the
generated file is current (``hack/unasync.py --check``). Edit this package, never ``_sync``;
what the two libraries do differently lives in :mod:`sandbox_client._kube`. The public faces
are :mod:`sandbox_client.aio` and :mod:`sandbox_client.client`.
"""

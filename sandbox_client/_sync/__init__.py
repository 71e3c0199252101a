"""The blocking client, generated from :mod:`sandbox_client._async` by ``hack/unasync.py``.

Do not edit :mod:`sandbox_client._sync.client`: edit ``sandbox_client/_async/client.py`` and run
``hack/unasync.py``. The public face is :mod:`sandbox_client.client`.
"""

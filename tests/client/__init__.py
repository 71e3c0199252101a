"""Tests of the engine's client (sandbox_client): ``_async/`` is written by hand, ``_sync/`` is
generated from it by hack/unasync.py; the other modules test one surface each."""

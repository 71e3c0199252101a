"""reconcilers: the thin kopf handlers, one module per custom resource, each with explicit ids.

Every handler passes kopf's arguments to the logic in :mod:`sandbox_operator.resources`, reached
through :func:`sandbox_operator.runtime.runtime`; :mod:`.metadata` is the one event handler all
three kinds share. :mod:`sandbox_operator.main` imports these modules, which registers their
handlers with kopf. A handler id is stored in objects (kopf's progress annotations): never
change one.

May import: kopf, :mod:`sandbox_operator.runtime`, :mod:`sandbox_operator.resources` and
everything below it (``executors``, ``errors``, ``kube``, ``settings``). ``sandbox``,
``checkpoint`` and ``plancommit`` never import each other.
"""

"""kube: the Kubernetes side of the operator, shared by every layer above it.

API access (:mod:`.api`), Events (:mod:`.events`), status conditions (:mod:`.conditions`),
kopf's diff-base on the status (:mod:`.diffbase`), leader election (:mod:`.leader`), Prometheus
metrics (:mod:`.metrics`), secret redaction (:mod:`.redaction`), JSON logs (:mod:`.logs`) and
the claims that keep a handler off an object being finalized (:mod:`.claims`).

May import: :mod:`sandbox_operator.settings`, ``sandbox_api``, the core's public names, kopf,
kubernetes and the other modules of this package. Nothing else of the operator: ``errors``,
``executors``, ``resources``, ``reconcilers``, ``runtime`` and ``main`` import this package,
never the reverse.
"""

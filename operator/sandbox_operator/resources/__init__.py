"""resources: the logic of each custom resource, callable and testable without kopf running.

:mod:`.sandbox`, :mod:`.checkpoint` and :mod:`.plancommit` hold one logic class each (what a
handler does); :mod:`.targets` turns a Sandbox or Checkpoint body into what the executors act on,
so that no resource imports another for it. The PlanCommit's helpers: its journal on the status
(:mod:`.journal`), resuming an interrupted attempt (:mod:`.resume`), the review and approval
decision (:mod:`.approval`) and the identity of a sandbox's original (:mod:`.plan_sources`).
``resume`` is here, not beside the reconcilers: it is logic of the PlanCommit, with no kopf.

May import: :mod:`sandbox_operator.executors`, :mod:`sandbox_operator.errors`,
:mod:`sandbox_operator.kube`, :mod:`sandbox_operator.settings`, ``sandbox_api`` and the core.
Not kopf: a handler's retry decision is raised as :data:`sandbox_operator.errors.TemporaryError`
or :data:`~sandbox_operator.errors.PermanentError` (kopf's classes, named there). Inside the
package, ``plancommit`` may import ``sandbox`` (it mirrors the status of the plan's Sandboxes);
``sandbox`` and ``checkpoint`` import neither each other nor ``plancommit``.
"""

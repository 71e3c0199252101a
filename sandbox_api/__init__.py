"""sandbox_api: the contract of the custom resources, shared by the operator and the client.

- :mod:`sandbox_api.models`: the typed specs and statuses of ``Sandbox``, ``Checkpoint`` and
  ``PlanCommit`` (pydantic, camelCase on the wire, as in ``crds/``);
- :mod:`sandbox_api.naming`: the names of the child objects the operator makes for a Sandbox;
- :mod:`sandbox_api.core_record`: what of the core's persisted record the status may carry.

It imports pydantic and the core's vocabulary only: no kopf, no Kubernetes client, no strategy.
"""

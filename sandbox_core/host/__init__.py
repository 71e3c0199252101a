"""Sandboxes kept in a state directory: records, checkpoints, provisioning and the manager.

``store`` (one JSON record per sandbox), ``checkpoint`` (snapshots a sandbox can be restored
to), ``host`` (the one idempotent provision and reopen of a sandbox) and ``manager``
(sandboxes per plan, committed all or nothing through :mod:`sandbox_core.plan`).
"""

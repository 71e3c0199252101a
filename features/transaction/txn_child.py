"""A separate process driving a transaction sandbox (restart scenarios of transaction.feature).

Usage: ``python txn_child.py '<json spec>'``. The spec names ``action`` (``create`` or
``commit``), ``state_dir`` (the SandboxStore), ``rows`` to insert and the ``placeholder``.
``create`` makes a sandbox, inserts, saves its record and dies with the transaction open.
``commit`` reopens the stored sandbox, reads, inserts, saves, commits; with ``die_after_commit``
it dies right after COMMIT, before saving the new status (the crash window of case 20).
Prints one JSON line: ``{"sandbox_id": ..., "seen": [...], "result": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys

from sandbox_core.host.store import SandboxStore
from sandbox_core.strategies.transaction import TransactionSandbox


def main(spec: dict[str, object]) -> None:
    store = SandboxStore(str(spec["state_dir"]))
    insert = f"INSERT INTO items (name) VALUES ({spec['placeholder']})"  # noqa: S608
    if spec["action"] == "create":
        sandbox = TransactionSandbox(
            "res-001", str(spec["original"]), sandbox_root=str(spec["sandbox_root"])
        )
        sandbox.create(str(spec["plan_id"]))
        for row in spec["rows"]:  # type: ignore[attr-defined]
            sandbox.execute(insert, (row,))
        store.save(sandbox)
        print(json.dumps({"sandbox_id": sandbox.sandbox_id}), flush=True)
        os._exit(0)  # die with the transaction open: no close(), no cleanup()
    sandbox = TransactionSandbox.reopen(store.load(str(spec["sandbox_id"])))
    seen = [row[0] for row in sandbox.execute("SELECT name FROM items ORDER BY name")]
    for row in spec["rows"]:  # type: ignore[attr-defined]
        sandbox.execute(insert, (row,))
    store.save(sandbox)
    result = sandbox.commit()
    if spec.get("die_after_commit"):
        print(json.dumps({"sandbox_id": sandbox.sandbox_id, "seen": seen}), flush=True)
        os._exit(0)
    store.save(sandbox)
    print(json.dumps({"sandbox_id": sandbox.sandbox_id, "seen": seen, "result": result.to_dict()}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))

"""JSON logs (python-json-logger) for the operator process (issue 3, "Observability")."""

from __future__ import annotations

import logging

from pythonjsonlogger.json import JsonFormatter


def configure_logging(log_format: str, level: int = logging.INFO) -> None:
    """Send every record to stderr as one JSON object per line (``plain``: classic text).

    Replaces the root handlers, including the ones ``kopf run`` installs.
    """
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)

"""JSON logs (python-json-logger) for the operator process."""

from __future__ import annotations

import json
import logging

from pythonjsonlogger.json import JsonFormatter

from sandbox_operator.kube.redaction import ScrubFilter

# kopf attaches its OperatorSettings (locks inside: not serialisable) and a skip flag to records.
_DROPPED_ATTRIBUTES = ("settings", "k8s_skip")


class _DropKopfInternals(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for name in _DROPPED_ATTRIBUTES:
            record.__dict__.pop(name, None)
        return True


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
                json_encoder=json.JSONEncoder,
                json_default=str,
            )
        )
        handler.addFilter(_DropKopfInternals())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(ScrubFilter())  # no secret in any log line
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kopf turns its per-object log records into Events through its own handler on this logger.
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, ScrubFilter) for f in objects.filters):
        objects.addFilter(ScrubFilter())

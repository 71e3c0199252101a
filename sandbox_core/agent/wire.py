"""The workspace agent's contract on the wire: routes, headers, error codes, limits.

One table, shared by the agent's server (:mod:`sandbox_core.agent.server`) and by every client
of it (the operator's pod executor, ``sandbox_client``'s file operations through the pod proxy).
It imports only the standard library and the core's vocabulary (``sandbox_core.errors``): a
client importing it loads no aiohttp, no GitPython, no psycopg and no strategy code.

Requests and replies are JSON (:data:`JSON_CONTENT_TYPE`), except the body of ``PUT .../files``:
the file's bytes (:data:`BYTES_CONTENT_TYPE`). Every request except ``GET /healthz`` carries the
Pod's token, as ``Authorization: Bearer <token>`` or, through the API server's pod proxy (which
consumes ``Authorization``), as :data:`TOKEN_HEADER`. A changing request (POST, PUT, DELETE)
carries :data:`REQUEST_ID_HEADER`; a reply served again from the agent's journal carries
``X-Idempotent-Replay: true``.

A refusal is ``{"error": {"type", "message"}}`` (plus ``conflicts`` for a refused commit,
``approved_digest`` and ``actual_digest`` for a plan changed since approval), with the status:

    400  BadRequest      a changing request without a valid request id, a body that is not
                         a JSON object, or a field of the wrong type (``BODY_FIELDS``; the
                         message names the field); every refusal of the HTTP layer (404 no
                         route, 405, 413 too large) is JSON of this shape too
    401  Unauthorized    no token, or not this Pod's
    401  TokenExpired    this Pod's token, held longer than its lifetime (``agent.tokens``)
    404  NotFound        no such sandbox, checkpoint, file or directory (an actor's file
                         operation: SandboxFileNotFoundError)
    409  <core error>    SandboxCommitError and its kinds (``conflicts``; the two digests of a
                         ChangedSinceApprovalError), or SandboxStateError
    429  ExecLimitError  the sandbox already runs its limit of commands (``EXEC``)
    422  <core error>    any other SandboxError, a ValueError (traversal, a bad txid), or
                         MissingSecret (a DSN reference ``env:NAME`` whose NAME is unset)
    500  <error>         anything else; may pass on retry
    507  StateVolumeFull the agent's state volume has no room for the request's record:
                         refused before the operation, nothing done

:func:`error_reply` writes that body from an exception (the agent), :func:`core_error` reads
the core exception back from it (a client that wants a remote sandbox to raise what a local one
does).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox_core.errors import (
    ChangedSinceApprovalError,
    SandboxCommitError,
    SandboxCommitNoSpaceError,
    SandboxCommitPermissionError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileOperationError,
    SandboxNoSpaceError,
    SandboxPathError,
    SandboxPermissionError,
    SandboxRollbackNoSpaceError,
    SandboxRollbackPermissionError,
    SandboxStateError,
    TwoPhaseUnavailableError,
)

# -- the workspace Pod ----------------------------------------------------------------------------

DEFAULT_PORT = 8471
TOKEN_FILE = "/var/run/sandbox-agent/token"  # noqa: S105 - a path, not a token
# The environment the workspace Pod gives the agent (AgentConfig.from_env reads it).
STATE_DIR_ENV = "SANDBOX_CORE_STATE_DIR"
ROOT_ENV = "SANDBOX_CORE_ROOT"
TOKEN_FILE_ENV = "SANDBOX_AGENT_TOKEN_FILE"  # noqa: S105 - a variable name, not a token
PORT_ENV = "SANDBOX_AGENT_PORT"
SOURCE_DSN_ENV = "SANDBOX_SOURCE_DSN"  # filled by the kubelet from the Sandbox's secretRef
# Where the agent's create may find originals: absolute paths joined by ":" (the operator sets
# it from the Sandbox's spec: the claim's mount path plus ``subPath``; empty for a Secret's DSN).
# Unset (a local agent): any path but the agent's own state, /proc, /sys and /dev.
ALLOWED_ROOTS_ENV = "SANDBOX_AGENT_ALLOWED_ROOTS"
# A DSN is sent as ``env:NAME``, never as its value; every reply shows the reference.
ENV_REF = "env:"
# A warm-pool Pod (no Sandbox yet) holds no token file but its pool's bootstrap token, a file
# named by this variable; the operator hands it the Sandbox's token with ``HANDOVER``.
BOOTSTRAP_TOKEN_FILE_ENV = "SANDBOX_AGENT_BOOTSTRAP_TOKEN_FILE"  # noqa: S105 - a name
BOOTSTRAP_TOKEN_FILE = "/var/run/sandbox-pool/token"  # noqa: S105 - a path, not a token
# Where an agent keeps the token handed over to it (under its state directory, mode 0600).
HANDED_TOKEN_FILE = "handed-over.json"  # noqa: S105 - a file name, not a token

# -- headers, content types, limits ------------------------------------------------------------

AUTHORIZATION_HEADER = "Authorization"
BEARER_PREFIX = "Bearer "
# The token for callers that reach the agent through the API server's pod proxy (the engine's
# client): the API server consumes ``Authorization`` (its own credentials) and never
# forwards it, so the proxied request carries the agent token in this header instead.
TOKEN_HEADER = "X-Sandbox-Agent-Token"  # noqa: S105 - a header name, not a token
REQUEST_ID_HEADER = "X-Request-Id"
REPLAY_HEADER = "X-Idempotent-Replay"
JSON_CONTENT_TYPE = "application/json"
BYTES_CONTENT_TYPE = "application/octet-stream"
PATH_QUERY = "path"  # ``?path=REL``: a path relative to the sandbox's root ("." by default)
MAX_BODY_BYTES = 64 * 1024 * 1024
REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
TXID_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # the two-phase coordinator's transaction ids
CHANGING_METHODS = frozenset({"POST", "PUT", "DELETE"})

# -- routes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One route of the agent: its HTTP method and its path template (``{sid}``, ``{cid}``)."""

    method: str
    template: str

    @property
    def changes(self) -> bool:
        """Whether a request must carry :data:`REQUEST_ID_HEADER` (its reply is journaled)."""
        return self.method in CHANGING_METHODS

    def path(self, **params: str) -> str:
        """The template filled in, each value percent-quoted: ``STATUS.path(sid="01J...")``."""
        return self.template.format(
            **{name: urllib.parse.quote(value, safe="") for name, value in params.items()}
        )


HEALTHZ = Route("GET", "/healthz")  # "ok" (unauthenticated; readiness probe)
CREATE = Route("POST", "/v1/sandboxes")  # create (idempotent by sandbox_id)
STATUS = Route("GET", "/v1/sandboxes/{sid}")  # status
CLEANUP = Route("DELETE", "/v1/sandboxes/{sid}")  # cleanup
ACTIVATE = Route("POST", "/v1/sandboxes/{sid}/activate")  # CREATED/ROLLED_BACK -> ACTIVE
PATH = Route("GET", "/v1/sandboxes/{sid}/path")  # ?path=REL: sandbox path (refuses traversal)
READ = Route("GET", "/v1/sandboxes/{sid}/files")  # ?path=REL: read a file (base64)
WRITE = Route("PUT", "/v1/sandboxes/{sid}/files")  # ?path=REL: write (body = the content)
LIST = Route("GET", "/v1/sandboxes/{sid}/list")  # ?path=REL: list a directory
DIFF = Route("GET", "/v1/sandboxes/{sid}/diff")  # unified diff
COMMIT = Route("POST", "/v1/sandboxes/{sid}/commit")  # {"message"}
ROLLBACK = Route("POST", "/v1/sandboxes/{sid}/rollback")  # {"reactivate": bool}
CHECKPOINT = Route("POST", "/v1/sandboxes/{sid}/checkpoints")  # {"phase", "metadata"}
RESTORE = Route("POST", "/v1/checkpoints/{cid}/restore")  # restore
REVIEW = Route("GET", "/v1/sandboxes/{sid}/review")  # change summary (no locks, no change)
PREPARE = Route("POST", "/v1/sandboxes/{sid}/prepare")  # {"txid", "message"} -> PreparedCommit
APPLY_PREPARED = Route("POST", "/v1/sandboxes/{sid}/apply-prepared")  # {"txid"} -> CommitResult
ABORT_PREPARED = Route("POST", "/v1/sandboxes/{sid}/abort-prepared")  # {"txid"}
COMMIT_LANDED = Route("GET", "/v1/sandboxes/{sid}/commit-landed")  # {"landed"}: recovery probe
# {"identity"}: what the original is (a database's system identifier and name; "" when the
# sandbox reports none): approvals are bound to it (docs/approvals.md)
TARGET_IDENTITY = Route("GET", "/v1/sandboxes/{sid}/target-identity")
# {"token", "allowed_root"} -> {"handed_over": true}: a warm-pool Pod becomes one Sandbox's.
# Authenticated with the pool's bootstrap token while nothing was handed over, afterwards only
# with the token handed over (a renewal); the bootstrap token never works again. The agent then
# accepts only the token handed over, and ``allowed_root`` (within the Pod's own allowed roots)
# narrows where a create may find the original. Idempotent without a request id (the same
# token again changes nothing); the reply never carries a token.
HANDOVER = Route("POST", "/v1/handover")

# A fork across workspace Pods (sandbox_core.agent.bundle, docs/forks.md): the parent's agent
# packs one checkpoint as a tar (TAR_CONTENT_TYPE, with Content-Length; ?max_bytes=N bounds
# it, else bundle.DEFAULT_MAX_BYTES), the fork's agent unpacks the body of IMPORT (the same
# bound; 413 PayloadTooLarge past it, 422 SandboxForkError for a member it refuses) into its own
# scratch volume -> {"checkpoint_id", "kind", "files", "bytes", "import_id"}; CREATE with
# "fork_checkpoint": CID then starts the new sandbox from it and drops the import.
EXPORT = Route("GET", "/v1/checkpoints/{cid}/export")
IMPORT = Route("PUT", "/v1/checkpoints/{cid}/import")
TAR_CONTENT_TYPE = "application/x-tar"
MAX_BYTES_QUERY = "max_bytes"
PAYLOAD_TOO_LARGE = 413

ROUTES: tuple[Route, ...] = (
    HEALTHZ,
    CREATE,
    STATUS,
    CLEANUP,
    ACTIVATE,
    PATH,
    READ,
    WRITE,
    LIST,
    DIFF,
    COMMIT,
    ROLLBACK,
    CHECKPOINT,
    RESTORE,
    REVIEW,
    PREPARE,
    APPLY_PREPARED,
    ABORT_PREPARED,
    COMMIT_LANDED,
    TARGET_IDENTITY,
    HANDOVER,
    EXPORT,
    IMPORT,
)

# -- the actor's door: commands and the audit log (docs/actor.md) -------------------------------
#
# The one reply that is not JSON: EXEC's, a stream of JSON lines (NDJSON_CONTENT_TYPE).
# EXEC runs one command in the sandbox's jail (sandbox_core.actor). The request is JSON:
#   {"argv": [..]} or {"shell": "line"}, and optionally "cwd" (relative to the sandbox's root),
#   "env" {NAME: value}, "stdin_b64", "timeout_seconds", "max_output_bytes" (per stream),
#   "network" (bool).
# A refusal before the command starts is the usual JSON error (400, 401, 404, 409, 422, and 429
# when the sandbox already runs its limit of commands). Once started, the reply is 200 with
# NDJSON_CONTENT_TYPE, chunked, one JSON object per line, written as the command writes:
#   {"event": "started", "exec_id": ID}
#   {"event": "stdout" | "stderr", "data_b64": BASE64}          (any number, in order)
#   {"event": "exit", "exec_id", "exit_code", "signal", "timed_out", "cancelled", "truncated",
#    "stdout_bytes", "stderr_bytes", "duration_seconds"}          (last)
#   {"event": "error", "error": {"type", "message"}}             (instead of exit: a failure)
# A stream that ends without "exit" or "error" was cut (the connection or the agent died; the
# command is killed when its caller goes away). The same request id sent again after the exit
# does not run the command again: the reply is the "exit" line alone, with REPLAY_HEADER.
# A caller that sends "Accept: FRAMES_CONTENT_TYPE" gets the same events as binary frames
# instead (no base64, no JSON per chunk: for large outputs): each frame is a one-byte tag,
# a 4-byte big-endian length and that many bytes; tag FRAME_STDOUT / FRAME_STDERR carry the
# output's raw bytes, FRAME_EVENT one JSON event of the list above ("started", "exit", "error").
# EXEC_SIGNAL {"signal": "SIGTERM" | "SIGINT" | "SIGKILL" | ...} signals a running command by its
# exec_id (SIGKILL cancels it): {"exec_id", "signalled"}; 404 when none runs under that id.
# AUDIT ?after=SEQ&limit=N: a page of the sandbox's audit log {"entries", "total", "next"}.

EXEC = Route("POST", "/v1/sandboxes/{sid}/exec")  # run a command (NDJSON stream, above)
EXEC_SIGNAL = Route("POST", "/v1/sandboxes/{sid}/exec/{eid}/signal")  # {"signal"}
AUDIT = Route("GET", "/v1/sandboxes/{sid}/audit")  # ?after=SEQ&limit=N
NDJSON_CONTENT_TYPE = "application/x-ndjson"
FRAMES_CONTENT_TYPE = "application/vnd.sandbox-agent.exec-frames"
FRAME_STDOUT = b"o"
FRAME_STDERR = b"e"
FRAME_EVENT = b"j"
TOO_MANY_REQUESTS = 429  # the sandbox already runs its limit of commands
AFTER_QUERY = "after"
LIMIT_QUERY = "limit"
EXEC_EVENTS = ("started", "stdout", "stderr", "exit", "error")

ROUTES = (*ROUTES, EXEC, EXEC_SIGNAL, AUDIT)

# -- the actor's files and SQL (sandbox_core.actor) ---------------------------------------------
#
# Paths are relative to the sandbox's root, resolved through directory descriptors: absolute
# paths, ``..`` and symlinks on the way are refused (422 SandboxPathError), and so is any change
# under ``.git``. Changing routes carry REQUEST_ID_HEADER like every other. Listings are capped
# and carry ``next_cursor`` (pass it back as CURSOR_QUERY to continue).

OFFSET_QUERY = "offset"  # bytes from the start of the file (0 by default)
LENGTH_QUERY = "length"  # bytes at most (to the end by default)
APPEND_QUERY = "append"  # "1": append instead of replacing
PATTERN_QUERY = "pattern"  # grep: a Python regular expression; glob: a shell pattern
GLOB_QUERY = "glob"  # grep: only files matching this shell pattern
IGNORE_CASE_QUERY = "ignore_case"  # grep: "1" for a case-insensitive match
MAX_QUERY = "max"  # the cap of one listing page
CURSOR_QUERY = "cursor"  # next_cursor of the previous page
FILE_SIZE_HEADER = "X-File-Size"  # FILE_BYTES: the whole file's size
RANGE_OFFSET_HEADER = "X-Range-Offset"  # FILE_BYTES: where the returned bytes start
NDJSON_CONTENT_TYPE = "application/x-ndjson"

# ?path=REL&offset=&length=: the bytes, streamed (BYTES_CONTENT_TYPE; FILE_SIZE_HEADER,
# RANGE_OFFSET_HEADER; Content-Length is the range's length).
FILE_BYTES = Route("GET", "/v1/sandboxes/{sid}/fs/bytes")
# ?path=REL&offset=&length=: {"path", "offset", "length", "size", "encoding": utf-8|base64,
# "content"} (at most 16 MiB; stream FILE_BYTES for more).
FILE_TEXT = Route("GET", "/v1/sandboxes/{sid}/fs/text")
# ?path=REL&append=1: body = the bytes -> {"path", "size", "appended"}.
FILE_PUT = Route("PUT", "/v1/sandboxes/{sid}/fs/bytes")
# {"path", "content", "encoding": "utf-8" (default) | "base64", "append": bool}
FILE_WRITE = Route("POST", "/v1/sandboxes/{sid}/fs/write")
FILE_STAT = Route("GET", "/v1/sandboxes/{sid}/fs/stat")  # ?path=REL: {"path", "type", ...}
# {"path", "old", "new", "replace_all": bool} -> {"path", "occurrences"}; refused (422
# SandboxFileOperationError) when old is absent, or not unique without replace_all.
FILE_EDIT = Route("POST", "/v1/sandboxes/{sid}/fs/edit")
FILE_DELETE = Route("POST", "/v1/sandboxes/{sid}/fs/delete")  # {"path", "recursive": bool}
FILE_MOVE = Route("POST", "/v1/sandboxes/{sid}/fs/move")  # {"path", "to", "overwrite": bool}
FILE_MKDIR = Route("POST", "/v1/sandboxes/{sid}/fs/mkdir")  # {"path", "parents", "exist_ok"}
# ?pattern=&path=&glob=&ignore_case=&max=&cursor= -> {"matches": [{"path", "line", "text"}],
# "truncated", "next_cursor"}
GREP = Route("GET", "/v1/sandboxes/{sid}/fs/grep")
# ?pattern=&path=&max=&cursor= -> {"paths": [{"path", "type"}], "truncated", "next_cursor"}
GLOB = Route("GET", "/v1/sandboxes/{sid}/fs/glob")
# {"files": [{"path", "content_b64"}]} -> {"results": [{"path", "ok", "size" | "error"}]}
UPLOAD = Route("POST", "/v1/sandboxes/{sid}/fs/upload")
# ?path=A&path=B: NDJSON, per file {"path", "offset", "data_b64"} chunks of at most 1 MiB, then
# {"path", "ok": true, "size"}, or {"path", "ok": false, "error": {"type", "message"}}.
DOWNLOAD = Route("GET", "/v1/sandboxes/{sid}/fs/download")
# {"sql", "params": list | object | null (for many: a list of them), "many": bool, "max_rows"}
# -> {"kind", "columns", "rows", "rowcount", "last_id", "truncated"}; bytes as {"$bytes": b64}.
# transaction_rollback sandboxes only (409 SandboxStateError otherwise).
SQL = Route("POST", "/v1/sandboxes/{sid}/sql")

ACTOR_ROUTES: tuple[Route, ...] = (
    FILE_BYTES,
    FILE_TEXT,
    FILE_PUT,
    FILE_WRITE,
    FILE_STAT,
    FILE_EDIT,
    FILE_DELETE,
    FILE_MOVE,
    FILE_MKDIR,
    GREP,
    GLOB,
    UPLOAD,
    DOWNLOAD,
    SQL,
)
ROUTES = ROUTES + ACTOR_ROUTES

# -- errors -------------------------------------------------------------------------------------

BAD_REQUEST = 400
UNAUTHORIZED = 401
TOKEN_EXPIRED = "TokenExpired"  # noqa: S105 - the error type of a 401 for an expired token
NOT_FOUND = 404
CONFLICT = 409
UNPROCESSABLE = 422
SERVER_ERROR = 500
INSUFFICIENT_STORAGE = 507  # the agent's state volume is (nearly) full: nothing was done
# A refusal that can never pass as sent (wrong state, conflict, invalid argument).
REFUSAL_STATUSES = frozenset({CONFLICT, UNPROCESSABLE})


class AgentError(Exception):
    """A request the agent refuses; ``status`` is the HTTP status of the reply."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


# -- request bodies -----------------------------------------------------------------------------

# The JSON body fields of each route that takes one, by type (``None`` is always accepted and
# means the default). A body that is not a JSON object, or a field of another type, is refused
# with 400 ``BadRequest`` naming the field (:func:`check_body`), before any operation runs.
_TEXT, _FLAG, _WHOLE, _NUMBER = (str,), (bool,), (int,), (int, float)
_OBJECT, _LIST = (dict,), (list,)
BODY_FIELDS: dict[Route, dict[str, tuple[type, ...]]] = {
    CREATE: {
        "plan_id": _TEXT, "resource_id": _TEXT, "original": _TEXT, "strategy": _TEXT,
        "sandbox_id": _TEXT, "options": _OBJECT, "fork_checkpoint": _TEXT,
    },
    COMMIT: {"message": _TEXT},
    HANDOVER: {"token": _TEXT, "allowed_root": _TEXT},
    ROLLBACK: {"reactivate": _FLAG},
    CHECKPOINT: {"phase": _TEXT, "metadata": _OBJECT},
    PREPARE: {"txid": _TEXT, "message": _TEXT},
    APPLY_PREPARED: {"txid": _TEXT},
    ABORT_PREPARED: {"txid": _TEXT},
    EXEC: {
        "argv": _LIST, "shell": _TEXT, "cwd": _TEXT, "env": _OBJECT, "stdin_b64": _TEXT,
        "timeout_seconds": _NUMBER, "max_output_bytes": _WHOLE, "network": _FLAG,
    },
    EXEC_SIGNAL: {"signal": _TEXT},
    FILE_WRITE: {"path": _TEXT, "content": _TEXT, "encoding": _TEXT, "append": _FLAG},
    FILE_EDIT: {"path": _TEXT, "old": _TEXT, "new": _TEXT, "replace_all": _FLAG},
    FILE_DELETE: {"path": _TEXT, "recursive": _FLAG},
    FILE_MOVE: {"path": _TEXT, "to": _TEXT, "overwrite": _FLAG},
    FILE_MKDIR: {"path": _TEXT, "parents": _FLAG, "exist_ok": _FLAG},
    UPLOAD: {"files": _LIST},
    SQL: {"sql": _TEXT, "params": (list, dict), "many": _FLAG, "max_rows": _WHOLE},
}  # fmt: skip
_KINDS = {
    _TEXT: "a string", _FLAG: "true or false", _WHOLE: "an integer", _NUMBER: "a number",
    _OBJECT: "an object", _LIST: "a list", (list, dict): "a list or an object",
}  # fmt: skip


def bad_request(message: str) -> AgentError:
    """A 400 ``BadRequest`` refusal (a malformed request: nothing was done)."""
    return AgentError(BAD_REQUEST, "BadRequest", message)


def check_body(route: Route, body: Any) -> dict[str, Any]:
    """``body`` when it is a JSON object whose known fields have their types (``None``: an
    empty body, ``{}``).

    Raises:
        AgentError: 400 ``BadRequest``, naming the field (never echoing its value).
    """
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    for name, kinds in BODY_FIELDS.get(route, {}).items():
        value = body.get(name)
        if value is None:
            continue
        wrong_bool = isinstance(value, bool) and bool not in kinds
        if wrong_bool or not isinstance(value, kinds):
            raise bad_request(f"{name} must be {_KINDS[kinds]}")
    return body


def error_reply(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and ``{"error": ...}`` body the agent replies for ``exc`` (the table above)."""
    if isinstance(exc, AgentError):
        status, type_ = exc.status, exc.type
    elif isinstance(exc, SandboxFileNotFoundError):
        status, type_ = NOT_FOUND, type(exc).__name__
    elif isinstance(exc, SandboxCommitError | SandboxStateError):
        status, type_ = CONFLICT, type(exc).__name__
    elif isinstance(exc, SandboxError | ValueError):
        status, type_ = UNPROCESSABLE, type(exc).__name__
    else:
        status, type_ = SERVER_ERROR, type(exc).__name__
    error: dict[str, Any] = {"type": type_, "message": str(exc)}
    if isinstance(exc, SandboxCommitError) and exc.conflicts:
        error["conflicts"] = list(exc.conflicts)
    if isinstance(exc, ChangedSinceApprovalError):
        error["approved_digest"] = exc.approved_digest
        error["actual_digest"] = exc.actual_digest
    return status, {"error": error}


def error_of(payload: Any) -> dict[str, Any]:
    """The ``error`` object of a decoded reply body; ``{}`` when it carries none (e.g. a reply
    of the API server itself, through the pod proxy)."""
    found = payload.get("error") if isinstance(payload, dict) else None
    return found if isinstance(found, dict) else {}


def core_error(error: Mapping[str, Any], message: str | None = None) -> SandboxError:
    """The core exception a refusal's ``error`` object stands for, so that callers of a remote
    sandbox see what a local one raises: ``SandboxStateError``, ``ChangedSinceApprovalError``
    (with both digests), ``TwoPhaseUnavailableError``, ``SandboxCommitError`` (with
    ``conflicts``; also for any commit, prepare or replay error), else ``SandboxError``.

    ``message`` defaults to the error's own (never a DSN: the agent hides secrets in every
    reply).
    """
    kind = str(error.get("type") or "Error")
    text = message if message is not None else str(error.get("message") or "")
    conflicts = [str(c) for c in error.get("conflicts") or []]
    if kind == "SandboxStateError":
        return SandboxStateError(text)
    if kind == "ChangedSinceApprovalError":
        return ChangedSinceApprovalError(
            text,
            approved_digest=str(error.get("approved_digest") or ""),
            actual_digest=str(error.get("actual_digest") or ""),
        )
    if kind == "TwoPhaseUnavailableError":
        return TwoPhaseUnavailableError(text)
    if kind in _RESOURCE_FAULTS:  # a full or read-only file system: retry once it is gone
        return _RESOURCE_FAULTS[kind](text)
    actor_errors = (SandboxPathError, SandboxFileNotFoundError, SandboxFileOperationError)
    for actor_error in actor_errors:
        if kind == actor_error.__name__:
            return actor_error(text)
    if conflicts or "Commit" in kind or "Conflict" in kind or "Replay" in kind:
        return SandboxCommitError(text, conflicts=conflicts or None)
    return SandboxError(text)


_RESOURCE_FAULTS: dict[str, Callable[[str], SandboxError]] = {
    "SandboxNoSpaceError": SandboxNoSpaceError,
    "SandboxCommitNoSpaceError": SandboxCommitNoSpaceError,
    "SandboxRollbackNoSpaceError": lambda text: SandboxRollbackNoSpaceError(text, refused=True),
    "SandboxPermissionError": SandboxPermissionError,
    "SandboxCommitPermissionError": SandboxCommitPermissionError,
    "SandboxRollbackPermissionError": lambda text: SandboxRollbackPermissionError(
        text, refused=True
    ),
}
"""The classified errors of a full or read-only file system (docs/fidelity.md, "Resource
faults"), decoded as themselves so that remote callers see them retryable or as permission
problems, as local ones do."""

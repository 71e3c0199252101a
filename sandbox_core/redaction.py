"""Redaction of secrets: DSN passwords hidden, scrubbed from messages, and compared without them.

The core's vocabulary for secrets, used by the ``transaction_rollback`` strategy, the workspace
agent, the operator, the client and ``sandbox_api``: it imports nothing of the core and no
database library at import time. PostgreSQL DSNs are parsed by the database library (psycopg's
``conninfo_to_dict``, which is libpq's own parser), imported on the first DSN parsed, so that
``import sandbox_client`` loads no psycopg. Both forms mean exactly what they mean to libpq: the
URL form (``postgresql://user:pw@host:port/db?password=...``) and the ``key=value`` form
(``host=h user=u password='p w'``).

Redaction policy (one function, :func:`redact`, used wherever a DSN is printed, logged or
stored): a DSN libpq can parse is rebuilt in ``key=value`` form from the fields libpq parsed,
with every secret field (``password``, ``sslpassword``) replaced by ``***``; a DSN without a
secret field is returned as given. Rebuilding from parsed fields drops anything libpq would
ignore (a URL user-info password overridden by ``?password=``), and keeps every other field
exactly, so the redacted form still names the same server and database. A string libpq cannot
parse is masked lexically (a URL's user-info password up to the last ``@``, every
``password=`` value): it could never connect, so over-masking costs nothing. Anything that is not
a DSN (a file path, ``sqlite:///...``) is returned unchanged. A password holding URL-reserved
characters must be percent-encoded (RFC 3986) in the URL form; unencoded, libpq reads its pieces
as host, port or database, and they are shown as such.

The redacted form is what the sandbox record stores. :func:`connectable` turns it back into a
DSN libpq can use: the masked fields are dropped, so libpq takes the password from
``PGPASSWORD``, ``PGPASSFILE`` or ``~/.pgpass``.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote

MASK = "***"
SECRET_KEYS = frozenset({"password", "sslpassword"})
POSTGRES_SCHEMES = frozenset({"postgresql", "postgres"})
# Secrets shorter than this are not scrubbed from free text (they would garble every message).
MIN_SCRUB_LENGTH = 4
# A line of a multi-line secret (a PEM block) is scrubbed on its own from this many characters:
# a message may quote one line of it (a parser's "bad line ..."), never the whole value.
MIN_LINE_SCRUB_LENGTH = 8

_URL = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.\-]*)://", re.DOTALL)
_KEY_VALUE = re.compile(r"^\s*[A-Za-z_][A-Za-z0-9_]*\s*=")
_URL_USERINFO_PASSWORD = re.compile(
    r"^(\s*[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(.*)@", re.DOTALL
)
# A password field: in a URL query it ends at "&" or "#"; in key=value text at white space,
# unless it is quoted.
_URL_PASSWORD_FIELD = re.compile(r"((?:ssl)?password=)([^&#]*)", re.IGNORECASE)
_KEY_VALUE_PASSWORD_FIELD = re.compile(
    r"((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE | re.DOTALL
)


def url_scheme(text: str) -> str | None:
    """The lower-case scheme of a ``scheme://...`` string, else ``None``."""
    match = _URL.match(text)
    return match.group(1).lower() if match else None


def is_postgres_dsn(text: str) -> bool:
    """True for a ``postgresql://`` / ``postgres://`` URL or a libpq ``key=value`` string."""
    scheme = url_scheme(text)
    if scheme is not None:
        return scheme in POSTGRES_SCHEMES
    return bool(_KEY_VALUE.match(text))


def _parse(text: str) -> dict[str, str] | None:
    """libpq's fields of ``text``, or ``None`` when libpq cannot parse it."""
    from psycopg import ProgrammingError  # loaded on first use: see the module docstring
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {key: str(value) for key, value in conninfo_to_dict(text).items()}
    except (ProgrammingError, ValueError):
        return None


def redact(text: str) -> str:
    """``text`` with every password it carries replaced by ``***`` (see the module policy).

    Never raises: a string that cannot be parsed is masked lexically instead.
    """
    scheme = url_scheme(text)
    if scheme == "sqlite" or (scheme is None and not _KEY_VALUE.match(text)):
        return text  # a file path: nothing to hide
    fields = _parse(text) if scheme is None or scheme in POSTGRES_SCHEMES else None
    if fields is None:
        return _mask_lexically(text)
    if not SECRET_KEYS & fields.keys():
        return text
    from psycopg.conninfo import make_conninfo  # loaded on first use: see the module docstring

    return make_conninfo("", **{k: MASK if k in SECRET_KEYS else v for k, v in fields.items()})


def _mask_lexically(text: str) -> str:
    if url_scheme(text) is None:
        return _KEY_VALUE_PASSWORD_FIELD.sub(lambda m: f"{m.group(1)}{MASK}", text)
    masked = _URL_USERINFO_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}@", text, count=1)
    return _URL_PASSWORD_FIELD.sub(lambda m: f"{m.group(1)}{MASK}", masked)


def connectable(text: str) -> str:
    """A DSN libpq can use from a redacted one: masked secret fields are dropped.

    A DSN that carries a real password (or none) is returned unchanged, as is one libpq cannot
    parse (connecting reports the parse error).
    """
    fields = _parse(text)
    if fields is None or not any(fields.get(key) == MASK for key in SECRET_KEYS):
        return text
    from psycopg.conninfo import make_conninfo  # loaded on first use: see the module docstring

    return make_conninfo("", **{k: v for k, v in fields.items() if fields[k] != MASK})


def secrets_of(text: str) -> tuple[str, ...]:
    """The secret values (passwords) ``text`` carries, as libpq parses them; ``()`` for none."""
    fields = _parse(text) if is_postgres_dsn(text) else None
    if fields is None:
        return ()
    return tuple(
        value for key, value in fields.items() if key in SECRET_KEYS and value and value != MASK
    )


def is_dsn(text: str) -> bool:
    """True when ``text`` (white space around it ignored) is a database location a Secret may
    hold: a ``postgresql://``/``postgres://`` or ``sqlite://`` URL, or a libpq ``key=value``
    string libpq parses. Anything else (a private key, a token, a password alone) is not, and
    must never be used as a path or shown (the caller names the Secret's key instead)."""
    text = text.strip()
    scheme = url_scheme(text)
    if scheme is not None:
        return scheme in POSTGRES_SCHEMES or scheme == "sqlite"
    return bool(_KEY_VALUE.match(text)) and bool(_parse(text))


def secret_forms(secret: str) -> frozenset[str]:
    """Every form in which ``secret`` (any value read from a Secret) may reach a message.

    The value itself; its stripped forms (no trailing newline or white space, none on either
    side); each of its lines, stripped, of at least :data:`MIN_LINE_SCRUB_LENGTH` characters
    (a PEM block's lines); the percent-encoded form (RFC 3986) of each of those; and the
    base64 of the value and of its stripped form (standard and URL-safe alphabets, without the
    ``=`` padding, so the padded form is covered too). Forms shorter than
    :data:`MIN_SCRUB_LENGTH` are left out (they would garble every message).
    """
    whole = {secret, secret.rstrip("\r\n"), secret.rstrip(), secret.strip()}
    lines = {line.strip() for line in secret.splitlines()}
    lines = {line for line in lines if len(line) >= MIN_LINE_SCRUB_LENGTH}
    forms = whole | lines | {quote(form, safe="") for form in whole | lines}
    for value in whole:
        data = value.encode("utf-8", "surrogatepass")
        forms |= {
            base64.b64encode(data).decode().rstrip("="),
            base64.urlsafe_b64encode(data).decode().rstrip("="),
        }
    return frozenset(form for form in forms if len(form) >= MIN_SCRUB_LENGTH)


def scrub(message: str, secrets: tuple[str, ...]) -> str:
    """``message`` with every form of each secret (:func:`secret_forms`: the value, stripped,
    its lines, percent-encoded, base64) replaced by ``***``, longest first.

    Defence in depth for driver messages; forms shorter than :data:`MIN_SCRUB_LENGTH`
    characters are left alone (replacing them would garble every message).
    """
    forms: set[str] = set()
    for secret in secrets:
        forms |= secret_forms(secret)
    for form in sorted(forms, key=len, reverse=True):
        message = message.replace(form, MASK)
    return message


def same_database(first: str, second: str) -> bool:
    """True when two DSNs differ at most in their secret fields (password, sslpassword)."""
    one, other = _parse(connectable(first)), _parse(connectable(second))
    if one is None or other is None:
        return first == second
    return {k: v for k, v in one.items() if k not in SECRET_KEYS} == {
        k: v for k, v in other.items() if k not in SECRET_KEYS
    }

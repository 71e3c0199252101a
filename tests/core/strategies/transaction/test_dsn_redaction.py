"""DSN parsing and password redaction (issue 7, §3): one function, property-tested.

The generated passwords start with ``Pw`` and end with ``Qz``, and every other part of the
generated DSNs is lower-case letters and digits, so any leaked piece of a password that reaches
either end shows as ``Pw`` or ``Qz`` in the output (raw, percent-encoded or quoted alike).
Then every surface that prints, logs or stores a DSN is checked on real sandboxes and the CLI.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sandbox_core.errors import SandboxCreationError, SandboxError
from sandbox_core.redaction import (
    MASK,
    connectable,
    is_postgres_dsn,
    redact,
    same_database,
    scrub,
    secrets_of,
)
from sandbox_core.strategies.transaction import TransactionSandbox

EXAMPLES = int(os.environ.get("SANDBOX_HYPOTHESIS_EXAMPLES", "150"))
# Bounded by default, more with the environment variable; no example database in the work tree.
PROPERTY = settings(
    max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], database=None
)
CLI = [sys.executable, "-m", "sandbox_core.cli", "--json"]

words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=8)
names = st.builds(lambda head, tail: head + tail, st.sampled_from("abcxyz"), words)
ports = st.integers(min_value=1, max_value=65535).map(str)
# Characters that end or split a field somewhere (URL delimiters, quoting, white space) are
# drawn often; any other character sometimes.
passwords = st.builds(
    lambda middle: f"Pw{middle}Qz",
    st.text(
        alphabet=st.one_of(
            st.sampled_from("&#@/:?=%+;,'\"\\ \t\n"),
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        ),
        max_size=16,
    ),
)
schemes = st.sampled_from(["postgresql", "postgres"])


def _escaped(value: str) -> str:
    """A libpq ``key=value`` quoted value."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@st.composite
def dsns(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A DSN in one of the forms people write, and the passwords it carries."""
    scheme, user, host, port, db = (
        draw(schemes),
        draw(names),
        draw(names),
        draw(ports),
        draw(names),
    )
    pw, pw2 = draw(passwords), draw(passwords)
    enc = quote(pw, safe="")
    form = draw(
        st.sampled_from(
            ["userinfo", "query", "both", "sslpassword", "keyvalue", "spaced", "multihost"]
        )
    )
    if form == "userinfo":
        dsn, secrets = f"{scheme}://{user}:{enc}@{host}:{port}/{db}", [pw]
    elif form == "query":
        dsn, secrets = f"{scheme}://{user}@{host}:{port}/{db}?password={enc}", [pw]
    elif form == "both":
        dsn = f"{scheme}://{user}:{enc}@{host}/{db}?password={quote(pw2, safe='')}"
        secrets = [pw, pw2]
    elif form == "sslpassword":
        dsn = f"{scheme}://{user}:{enc}@{host}/{db}?sslpassword={quote(pw2, safe='')}"
        secrets = [pw, pw2]
    elif form == "keyvalue":
        dsn, secrets = make_conninfo("", user=user, password=pw, host=host, dbname=db), [pw]
    elif form == "spaced":
        dsn, secrets = f"host={host}  password = {_escaped(pw)} dbname={db}", [pw]
    else:
        dsn = f"{scheme}://{user}:{enc}@{host}:{port},{draw(names)}:{draw(ports)}/{db}"
        secrets = [pw]
    if draw(st.booleans()):
        # A field libpq does not know makes the DSN unparsable: the lexical fallback must hold.
        if "://" in dsn:
            dsn += ("&" if "?" in dsn else "?") + "bogus=1"
        else:
            dsn += " bogus=1"
    return dsn, secrets


def assert_hidden(text: str, secrets: list[str]) -> None:
    assert "Pw" not in text and "Qz" not in text, text
    for secret in secrets:
        assert secret not in text and quote(secret, safe="") not in text


@PROPERTY
@given(dsns())
def test_redact_never_shows_a_password(case: tuple[str, list[str]]) -> None:
    dsn, secrets = case
    shown = redact(dsn)
    assert_hidden(shown, secrets)
    assert redact(shown) == shown  # idempotent: redacting a stored DSN changes nothing
    assert secrets_of(shown) == ()


@PROPERTY
@given(dsns())
def test_the_redacted_dsn_still_names_the_same_database(case: tuple[str, list[str]]) -> None:
    dsn, _ = case
    try:
        fields = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return  # unparsable: it never connects, so there is nothing to keep
    public = {k: v for k, v in fields.items() if k not in ("password", "sslpassword")}
    assert conninfo_to_dict(connectable(redact(dsn))) == public
    assert same_database(dsn, redact(dsn))
    assert is_postgres_dsn(dsn)


prose = st.text(alphabet="abcdefghijklmnopqrstuvwxyz :;,.'\"()=@/", max_size=40)


@PROPERTY
@given(passwords, prose, prose)
def test_scrub_removes_a_password_from_any_message(pw: str, before: str, after: str) -> None:
    for form in (pw, quote(pw, safe="")):
        assert_hidden(scrub(f"{before}{form}{after}", (pw,)), [pw])


@pytest.mark.parametrize(
    "text",
    ["/srv/data/app.db", "app.db", "sqlite:////srv/app.db", "/srv/user:pw@host/dir", ""],
)
def test_paths_are_not_dsns_and_pass_unchanged(text: str) -> None:
    assert redact(text) == text


def test_unsupported_schemes_are_masked_too() -> None:
    assert redact("mysql://u:Pw-s3cret-Qz@db/app") == f"mysql://u:{MASK}@db/app"


# -- every surface of a sandbox -----------------------------------------------------------------

FAKE = "postgresql://app:Pw-S3cret-Qz@127.0.0.1:1/none?sslmode=disable"


def test_an_unreachable_dsn_never_shows_its_password(tmp_path: Path) -> None:
    sandbox = TransactionSandbox("db", FAKE, sandbox_root=str(tmp_path), timeout_seconds=1)
    assert_hidden(sandbox.original_path, ["Pw-S3cret-Qz"])
    assert_hidden(json.dumps(sandbox.to_record()), ["Pw-S3cret-Qz"])
    with pytest.raises(SandboxCreationError) as caught:
        sandbox.create("plan")
    assert "127.0.0.1" in str(caught.value)
    assert_hidden(str(caught.value), ["Pw-S3cret-Qz"])
    assert_hidden(json.dumps(sandbox.to_record()), ["Pw-S3cret-Qz"])
    sandbox.cleanup()


def test_a_key_value_dsn_is_postgresql_and_redacted(tmp_path: Path) -> None:
    dsn = "host=127.0.0.1 port=1 dbname=none password='Pw s3\\'cret Qz'"
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(tmp_path), timeout_seconds=1)
    with pytest.raises(SandboxCreationError, match="Connection refused") as caught:
        sandbox.create("plan")
    assert_hidden(str(caught.value) + json.dumps(sandbox.to_record()), ["Pw s3'cret Qz"])
    sandbox.cleanup()


def _assert_no_server_password(text: str, dsn: str) -> None:
    """The test server's password equals its user name, so look for the password *forms*."""
    password = conninfo_to_dict(dsn)["password"]
    for form in (f":{password}@", f"password={password}", f"password={_escaped(password)}"):
        assert form not in text, text


@pytest.mark.postgres
def test_a_live_sandbox_stores_logs_and_reports_only_the_redacted_dsn(
    postgres_schema_dsn: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = postgres_schema_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    caplog.set_level(logging.DEBUG)
    sandbox = TransactionSandbox("db", dsn, sandbox_root=str(tmp_path))
    try:
        context = sandbox.create("plan")
        sandbox.execute("INSERT INTO items VALUES ('a')")
        with pytest.raises(SandboxError) as failed:
            sandbox.execute("INSERT INTO items VALUES ('a')")  # refused: duplicate key
        surfaces = [
            sandbox.original_path,
            json.dumps(sandbox.to_record()),
            json.dumps(context.to_dict()),
            str(failed.value),
            repr(sandbox._target()),
        ]
        assert "password=***" in sandbox.original_path
        sandbox.commit()
        surfaces.append(json.dumps(sandbox.to_record()))
        surfaces.append(caplog.text)
        for text in surfaces:
            _assert_no_server_password(text, dsn)
    finally:
        sandbox.cleanup()


@pytest.mark.postgres
def test_the_cli_never_prints_or_stores_the_password_and_reads_it_from_pgpassword(
    postgres_schema_dsn: str,
    tmp_path: Path,
) -> None:
    dsn = postgres_schema_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (name TEXT PRIMARY KEY)")
    env = {
        **os.environ,
        "SANDBOX_CORE_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_CORE_ROOT": str(tmp_path / "sandboxes"),
    }
    env.pop("PGPASSWORD", None)
    printed = []

    def cli(*args: str, expect: int = 0, extra: dict[str, str] | None = None) -> dict[str, object]:
        done = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, env={**env, **(extra or {})}
        )
        printed.append(done.stdout + done.stderr)
        assert done.returncode == expect, done.stdout + done.stderr
        result: dict[str, object] = json.loads(done.stdout)
        return result

    created = cli(
        "create", "--plan", "p", "--resource", "db", "--strategy", "transaction_rollback", dsn
    )
    sid = str(created["sandbox_id"])
    cli("status", sid)
    cli("list")
    # Another process has no password unless libpq gets it from its environment.
    refused = cli("commit", sid, expect=1)
    assert "PGPASSWORD" in json.dumps(refused)
    cli("commit", sid, extra={"PGPASSWORD": conninfo_to_dict(dsn)["password"]})
    state = "".join(p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file())
    for text in [*printed, state]:
        _assert_no_server_password(text, dsn)
    cli("cleanup", sid)

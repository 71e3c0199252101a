"""The review page of ``kubectl sandbox review --web PLAN``: a local web page where a person
reads a plan's changes and approves or rejects them as themself (docs/approvals.md).

:func:`serve` binds ``127.0.0.1`` on a random port and prints a URL with a token made for this run
(``secrets.token_urlsafe``, 32 bytes): every request without it is refused (403), so another
local user who finds the port can neither read the plan nor act. The page shows, for the
PlanCommit waiting for the plan's approval (or the newest reviewed one): the digest, its
creator, phase and conditions, every recorded decision (who, on which digest, counted or why
not), and per reviewed sandbox its counts, the reviewed paths or database statements, its
conflicts and its current diff, one block per file, highlighted by Pygments (its
``DiffLexer``; everything escaped). Approve and Reject are two forms posting back with the
token; they call :meth:`~sandbox_client.client.SandboxClient.decide` with the page's client,
i.e. the user's own kube credentials, so the admission policy records exactly that user.

No script runs on the page (``Content-Security-Policy: default-src 'none'``), every value
from the cluster is HTML-escaped, and the server answers only its own ``Host``.
"""

from __future__ import annotations

import hmac
import html
import re
import secrets
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from sandbox_client.client import SandboxClient
from sandbox_client.errors import NotFoundError, SandboxClientError
from sandbox_client.models import PLANCOMMIT_PLURAL, PlanReview, ReviewedSandbox

MAX_FORM_BYTES = 16 * 1024
MAX_DIFF_CHARS = 2_000_000
_FILE_HEADER = re.compile(r"^diff --git a/(.*?) b/(.*)$", re.MULTILINE)
CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 0.2em 0.5em; }
.digest { font-family: monospace; } .refused { color: #a00; } .notice { color: #060; }
section.sandbox { margin-top: 1.5em; } details.file { margin: 0.5em 0; }
.file pre { margin: 0; } summary { font-family: monospace; cursor: pointer; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def split_files(diff: str) -> list[tuple[str, str]]:
    """A git-format unified diff as (file name, that file's diff) pairs, in order; a diff
    without ``diff --git`` headers is one pair named ``""``."""
    headers = list(_FILE_HEADER.finditer(diff))
    if not headers:
        return [("", diff)] if diff.strip() else []
    out = []
    for index, header in enumerate(headers):
        end = headers[index + 1].start() if index + 1 < len(headers) else len(diff)
        out.append((header.group(2), diff[header.start() : end]))
    return out


def highlight_diff(text: str) -> str:
    """``text`` (one file's unified diff) as escaped, highlighted HTML (Pygments)."""
    from pygments import highlight  # type: ignore[import-untyped]
    from pygments.formatters import HtmlFormatter  # type: ignore[import-untyped]
    from pygments.lexers import DiffLexer  # type: ignore[import-untyped]

    return str(highlight(text, DiffLexer(), HtmlFormatter(cssclass="highlight")))


def _style_defs() -> str:
    from pygments.formatters import HtmlFormatter

    return str(HtmlFormatter().get_style_defs(".highlight"))


class ReviewPage:
    """The page's content and actions for one plan, through ``client`` (the user's own
    credentials).

    Args:
        client: a blocking :class:`SandboxClient`; its identity is the one recorded.
        plan_id: the plan (``spec.planId``).
        namespace: default the client's.
    """

    def __init__(self, client: SandboxClient, plan_id: str, namespace: str | None = None) -> None:
        self.client = client
        self.plan_id = plan_id
        self.namespace = namespace or client.namespace

    def review(self) -> PlanReview:
        """The PlanCommit waiting for this plan's approval, else its newest reviewed one.

        Raises:
            NotFoundError: the plan has no reviewed PlanCommit.
        """
        waiting = self.client.pending_approvals(self.namespace, self.plan_id)
        if waiting:
            return waiting[-1]
        objects = self.client.list_objects(PLANCOMMIT_PLURAL, self.namespace)
        objects.sort(key=lambda o: str(o["metadata"].get("creationTimestamp") or ""))
        for obj in reversed(objects):
            review = PlanReview.from_object(obj)
            if review is not None and review.plan_id == self.plan_id:
                return review
        raise NotFoundError(
            "NotFound", f"plan {self.plan_id} has no reviewed PlanCommit: run review first"
        )

    def decide(self, plancommit: str, digest: str, decision: str, comment: str) -> str:
        """Record the user's ``decision``; a sentence saying what was recorded.

        Raises:
            SandboxClientError: as :meth:`SandboxClient.decide` (the refusal is shown).
        """
        self.client.decide(
            plancommit, digest, decision, comment=comment or None, namespace=self.namespace
        )
        verb = "approved" if decision == "Approve" else "rejected"
        return f"{verb} plan digest {digest} of PlanCommit {plancommit}"

    def render(self, token: str, notice: str = "", error: str = "") -> str:
        """The whole page as HTML (every value from the cluster escaped)."""
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'>",
            f"<title>Review of plan {_e(self.plan_id)}</title>",
            f"<style>{_STYLE}{_style_defs()}</style></head><body>",
            f"<h1>Plan <span id='plan'>{_e(self.plan_id)}</span> in {_e(self.namespace)}</h1>",
        ]
        if notice:
            parts.append(f"<p class='notice' id='notice'>{_e(notice)}</p>")
        if error:
            parts.append(f"<p class='refused' id='error'>{_e(error)}</p>")
        try:
            who = self.client.whoami()
            parts.append(f"<p>You are <b id='whoami'>{_e(who.user)}</b>.</p>")
            review = self.review()
        except SandboxClientError as exc:
            parts.append(f"<p class='refused'>{_e(exc.reason)}: {_e(exc.message)}</p>")
            return "".join([*parts, "</body></html>"])
        parts.append(self._summary(review))
        parts.append(self._decisions(review))
        if review.phase.value == "AwaitingApproval":
            parts.append(self._forms(review, token))
        for row in review.sandboxes:
            parts.append(self._sandbox(row))
        return "".join([*parts, "</body></html>"])

    def _summary(self, review: PlanReview) -> str:
        conditions = "".join(
            f"<li>{_e(c.type)}={_e(c.status)} {_e(c.reason)}: {_e(c.message)}</li>"
            for c in review.conditions
        )
        needed = review.required_approvals or "the administrator's minimum"
        return (
            f"<p>PlanCommit <b id='plancommit'>{_e(review.plancommit)}</b>, phase "
            f"<b id='phase'>{_e(review.phase.value)}</b>, created by "
            f"<b id='creator'>{_e(review.created_by or 'unknown')}</b>, reviewed "
            f"{_e(review.reviewed_at)}{' (truncated)' if review.truncated else ''}.</p>"
            f"<p>Digest: <span class='digest' id='digest'>{_e(review.digest)}</span></p>"
            f"<p>Approvals needed: {_e(needed)}; approved by: <b id='approved-by'>"
            f"{_e(', '.join(review.approved_by) or 'nobody yet')}</b></p>"
            f"<ul id='conditions'>{conditions}</ul>"
        )

    def _decisions(self, review: PlanReview) -> str:
        if not review.approvals:
            return "<p id='decisions'>No decision recorded yet.</p>"
        rows = "".join(
            "<tr>"
            f"<td>{_e(d.user)}</td><td>{_e(d.decision)}</td><td class='digest'>{_e(d.digest)}</td>"
            f"<td>{_e('pending' if d.counted is None else ('yes' if d.counted else 'no'))}</td>"
            f"<td>{_e(d.reason)}</td><td>{_e(d.observed_at)}</td><td>{_e(d.comment)}</td>"
            "</tr>"
            for d in review.approvals
        )
        return (
            "<table id='decisions'><tr><th>user</th><th>decision</th><th>digest</th>"
            "<th>counted</th><th>reason</th><th>seen</th><th>comment</th></tr>"
            f"{rows}</table>"
        )

    def _forms(self, review: PlanReview, token: str) -> str:
        hidden = (
            f"<input type='hidden' name='token' value='{_e(token)}'>"
            f"<input type='hidden' name='plancommit' value='{_e(review.plancommit)}'>"
            f"<input type='hidden' name='digest' value='{_e(review.digest)}'>"
        )
        return (
            "<form method='post' action='/decide'>"
            f"{hidden}<label>Comment <input name='comment' id='comment' maxlength='1000'>"
            "</label> <button type='submit' name='decision' value='Approve' id='approve'>"
            "Approve</button> <button type='submit' name='decision' value='Reject' "
            "id='reject'>Reject</button></form>"
        )

    def _sandbox(self, row: ReviewedSandbox) -> str:
        name = row.name or row.sandbox_id
        head = (
            f"<section class='sandbox' data-sandbox='{_e(name)}'><h2>{_e(name)} "
            f"({_e(row.strategy)})</h2><p>files +{row.added} ~{row.changed} -{row.deleted}, "
            f"lines +{row.lines_added} -{row.lines_removed}, {row.bytes} bytes, "
            f"{row.statements} database statement(s); digest "
            f"<span class='digest'>{_e(row.digest)}</span></p>"
        )
        listed = "".join(f"<li>{_e(p)}</li>" for p in row.paths)
        if listed:  # as reviewed: the first paths (A/M/D), or a database's statements
            head += f"<p>Reviewed changes:</p><ul class='reviewed'>{listed}</ul>"
        conflicts = "".join(f"<li class='refused'>{_e(c)}</li>" for c in row.conflicts)
        if conflicts:
            head += f"<p>Conflicts (the commit would be refused now):</p><ul>{conflicts}</ul>"
        return f"{head}{self._diff(name, row)}</section>"

    def _diff(self, name: str, row: ReviewedSandbox) -> str:
        if not row.name:
            return "<p>(no Sandbox name: diff not available)</p>"
        try:
            diff = self.client.sandbox(row.name, self.namespace).diff()
        except SandboxClientError as exc:
            return f"<p>Diff not available ({_e(exc.reason)}: {_e(exc.message)}).</p>"
        if len(diff) > MAX_DIFF_CHARS:
            diff = diff[:MAX_DIFF_CHARS] + "\n... (cut)\n"
        files = split_files(diff)
        if not files:
            return "<p>(no changes now: the sandbox equals its original)</p>"
        return "".join(
            f"<details class='file' open data-file='{_e(path)}'><summary>{_e(path or name)}"
            f"</summary>{highlight_diff(text)}</details>"
            for path, text in files
        )


def _handler(page: ReviewPage, token: str, host: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "sandbox-review"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            return  # nothing on stderr: the URL's token must not be logged

        def _allowed(self, given: str) -> bool:
            if self.headers.get("Host") != host:
                return False
            return hmac.compare_digest(given.encode(), token.encode())

        def _send(self, status: HTTPStatus, body: str, location: str = "") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            self.send_header("Cache-Control", "no-store")
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if url.path != "/" or not self._allowed((query.get("token") or [""])[0]):
                self._send(HTTPStatus.FORBIDDEN, "forbidden")
                return
            notice = (query.get("notice") or [""])[0]
            error = (query.get("error") or [""])[0]
            self._send(HTTPStatus.OK, page.render(token, notice, error))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if urlsplit(self.path).path != "/decide" or not 0 < length <= MAX_FORM_BYTES:
                self._send(HTTPStatus.FORBIDDEN, "forbidden")
                return
            form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))

            def field(key: str) -> str:
                return (form.get(key) or [""])[0]

            if not self._allowed(field("token")):
                self._send(HTTPStatus.FORBIDDEN, "forbidden")
                return
            try:
                said = page.decide(
                    field("plancommit"), field("digest"), field("decision"), field("comment")
                )
                back = f"/?token={quote(token)}&notice={quote(said)}"
            except SandboxClientError as exc:
                back = f"/?token={quote(token)}&error={quote(f'{exc.reason}: {exc.message}')}"
            self._send(HTTPStatus.SEE_OTHER, "", location=back)

    return Handler


class ReviewServer:
    """The page served on ``127.0.0.1`` (a random free port unless ``port``); :attr:`url`
    carries the token. Use :meth:`serve_forever` (blocking) and :meth:`close`."""

    def __init__(self, page: ReviewPage, port: int = 0) -> None:
        self.token = secrets.token_urlsafe(32)
        self.httpd = HTTPServer(("127.0.0.1", port), BaseHTTPRequestHandler)
        self.port = int(self.httpd.server_address[1])
        host = f"127.0.0.1:{self.port}"
        self.httpd.RequestHandlerClass = _handler(page, self.token, host)
        self.url = f"http://{host}/?token={self.token}"

    def serve_forever(self) -> None:
        """Answer requests until :meth:`close` (from another thread) or an interrupt."""
        self.httpd.serve_forever()

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(page: ReviewPage, announce: Callable[[str], None], port: int = 0) -> None:
    """Serve ``page`` until interrupted; ``announce`` gets the URL (with its token) first."""
    server = ReviewServer(page, port)
    announce(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()

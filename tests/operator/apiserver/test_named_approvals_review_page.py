"""Named approvals through the client, the plugin and the review page, on the real API server
with the chart's approval policy and the operator (docs/approvals.md, "Approving").

People and the engine are impersonated (the client's ``impersonate``, the plugin's ``--as``):
the client records the identity the API server authenticates, so the policy refuses the
engine's service account and the PlanCommit's creator, and admits alice. The review page
(``kubectl sandbox review --web``) is driven in a real headless browser (Debian's chromium and
chromedriver, through selenium): it renders the plan's real diff, escapes a file name and a
line made of HTML, refuses a request without its token, and an Approve clicked there is
recorded as alice and commits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from sandbox_client import Plan, RefusedError, SandboxClient
from sandbox_client.kubectl_plugin import cli
from sandbox_client.review_page import ReviewPage, ReviewServer
from tests.support.approvals import grant_plancommit_rights, install_approval_policy
from tests.support.operator import (
    Cluster,
    OperatorProcess,
    make_dir,
    run_operator,
    sandbox_manifest,
)

pytestmark = pytest.mark.slow

HOSTILE = "<img src=x onerror=alert(1)>.txt"


@pytest.fixture(scope="module")
def policy(local_apiserver: Any) -> Iterator[None]:
    probe = Cluster.fresh(local_apiserver, prefix="nrp-probe")
    manifest = install_approval_policy(local_apiserver, probe, "nrp")
    yield
    local_apiserver.kubectl("delete", "-f", "-", input=manifest, check=False)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    """One headless chromium for the module."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "hack/setup.sh installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    started = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    yield started
    started.quit()


def _notice_after_submit(browser: webdriver.Chrome) -> str:
    """The notice of the page the form's redirect leads to: a click returns before the browser
    has followed the POST's redirect, so wait for it (seconds on a loaded machine)."""
    element = WebDriverWait(browser, 60).until(
        expected_conditions.presence_of_element_located((By.ID, "notice"))
    )
    return str(element.text)


@pytest.fixture
def cluster(local_apiserver: Any, policy: None) -> Cluster:
    cluster = Cluster.fresh(local_apiserver, prefix="nrp")
    grant_plancommit_rights(cluster)
    return cluster


@pytest.fixture
def operator(local_apiserver: Any, cluster: Cluster, tmp_path: Path) -> Iterator[OperatorProcess]:
    yield from run_operator(local_apiserver, cluster, tmp_path)


def client_as(server: Any, cluster: Cluster, user: str) -> SandboxClient:
    return SandboxClient(
        kubeconfig=str(server.kubeconfig_path), namespace=cluster.namespace, impersonate=user
    )


def edited_plan(cluster: Cluster, tmp_path: Path, plan: str) -> Path:
    """A copy_on_write Sandbox of ``plan`` with g.txt changed and a file whose name and line
    are HTML; the original directory."""
    data = make_dir(tmp_path / f"{plan}-data", {"g.txt": "d0\n"})
    cluster.create(sandbox_manifest(f"{plan}-sb", plan, "copy_on_write", data))
    root = Path(cluster.wait_active(f"{plan}-sb")["sandboxPath"])
    (root / "g.txt").write_text("d1\n")
    (root / HOSTILE).write_text("<script>window.injected = 1</script>\n")
    return data


def test_the_client_records_who_approves_and_refuses_the_engine_and_the_creator(
    local_apiserver: Any, cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> None:
    operator.start()
    data = edited_plan(cluster, tmp_path, "plan-cl")
    engine = f"system:serviceaccount:{cluster.namespace}:engine"
    with client_as(local_apiserver, cluster, "carol") as carol:
        review = Plan(carol, "plan-cl").review(timeout=90)
    assert review.created_by == "carol"
    for who, said in ((engine, "may not approve"), ("carol", "creator of a PlanCommit")):
        with client_as(local_apiserver, cluster, who) as someone, pytest.raises(RefusedError) as no:
            Plan(someone, "plan-cl").approve(review.digest, wait=False)
        assert said in no.value.message, (who, no.value)
    pending = CliRunner().invoke(
        cli,
        ["pending", "-o", "json", "-n", cluster.namespace, "--as", "bob",
         "--kubeconfig", str(local_apiserver.kubeconfig_path)],
        catch_exceptions=False,
    )  # fmt: skip
    assert pending.exit_code == 0, pending.output
    [row] = json.loads(pending.stdout)
    assert (row["plancommit"], row["digest"], row["approvals"]) == (
        review.plancommit,
        review.digest,
        [],
    )
    with client_as(local_apiserver, cluster, "alice") as alice:
        result = Plan(alice, "plan-cl").approve(review.digest, timeout=90)
        who = alice.whoami()
    assert result.committed, result.conditions
    entry = result.raw["spec"]["approvals"][0]
    assert (entry["user"], entry["groups"]) == ("alice", who.groups)
    assert result.raw["status"]["approvedBy"] == "alice"
    assert (data / "g.txt").read_text() == "d1\n"
    # The plugin serves the page with the user's credentials; the URL alone opens it.
    command = [
        sys.executable, "-c", "from sandbox_client.kubectl_plugin import main; main()",
        "review", "--web", "plan-cl", "-n", cluster.namespace, "--as", "bob",
        "--kubeconfig", str(local_apiserver.kubeconfig_path),
    ]  # fmt: skip
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, f"{root}/operator"])}
    web = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert web.stdout is not None
        url = web.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:") and "token=" in url
        with urllib.request.urlopen(url, timeout=30) as reply:  # noqa: S310 - checked above
            page = reply.read().decode()
            assert "default-src 'none'" in reply.headers["Content-Security-Policy"]
        assert "<b id='whoami'>bob</b>" in page and review.digest in page
        assert "id='approve'" not in page  # committed: nothing left to decide
        assert "&lt;img src=x onerror=alert(1)&gt;.txt" in page and "<img" not in page
    finally:
        web.terminate()
        web.wait(timeout=30)
        if web.stdout is not None:
            web.stdout.close()


def test_the_review_page_shows_the_diff_and_records_alices_approval(
    local_apiserver: Any,
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
    browser: webdriver.Chrome,
) -> None:
    operator.start()
    data = edited_plan(cluster, tmp_path, "plan-web")
    with client_as(local_apiserver, cluster, "carol") as carol:
        review = Plan(carol, "plan-web").review(timeout=90)
    with client_as(local_apiserver, cluster, "alice") as alice:
        server = ReviewServer(ReviewPage(alice, "plan-web"))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"http://127.0.0.1:{server.port}/?token=guess")
            assert refused.value.code == 403
            browser.get(server.url)
            assert browser.find_element(By.ID, "whoami").text == "alice"
            assert browser.find_element(By.ID, "digest").text == review.digest
            assert browser.find_element(By.ID, "creator").text == "carol"
            files = {
                f.get_attribute("data-file"): f.text
                for f in browser.find_elements(By.CSS_SELECTOR, "details.file")
            }
            assert set(files) == {"g.txt", HOSTILE}
            assert "-d0" in files["g.txt"] and "+d1" in files["g.txt"]
            assert "+<script>window.injected = 1</script>" in files[HOSTILE]
            assert browser.execute_script("return window.injected") is None
            assert not browser.find_elements(By.CSS_SELECTOR, "img, script")
            assert browser.find_elements(By.CSS_SELECTOR, ".highlight .gi")  # added lines
            assert (data / "g.txt").read_text() == "d0\n"
            browser.find_element(By.ID, "approve").click()
            notice = _notice_after_submit(browser)
            assert (
                notice == f"approved plan digest {review.digest} of PlanCommit {review.plancommit}"
            )
        finally:
            server.close()
    status = cluster.wait_phase("pcommit", review.plancommit, {"Committed", "Failed"})
    assert status["phase"] == "Committed", status
    assert status["approvedBy"] == "alice"
    assert [(a["user"], a["decision"]) for a in status["approvals"]] == [("alice", "Approve")]
    assert (data / "g.txt").read_text() == "d1\n"


def test_a_rejection_on_the_page_ends_the_plancommit_with_alices_comment(
    local_apiserver: Any,
    cluster: Cluster,
    operator: OperatorProcess,
    tmp_path: Path,
    browser: webdriver.Chrome,
) -> None:
    operator.start()
    data = edited_plan(cluster, tmp_path, "plan-no")
    with client_as(local_apiserver, cluster, "carol") as carol:
        review = Plan(carol, "plan-no").review(timeout=90)
    with client_as(local_apiserver, cluster, "alice") as alice:
        server = ReviewServer(ReviewPage(alice, "plan-no"))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            browser.get(server.url)
            browser.find_element(By.ID, "comment").send_keys("<b>not</b> this one")
            browser.find_element(By.ID, "reject").click()
            assert _notice_after_submit(browser).startswith("rejected plan digest")
            status = cluster.wait_phase("pcommit", review.plancommit, {"Committed", "Failed"})
            browser.get(server.url)
            decisions = browser.find_element(By.ID, "decisions").text
            assert "alice Reject" in decisions and "<b>not</b> this one" in decisions
            assert not browser.find_elements(By.CSS_SELECTOR, "#decisions b")
            assert not browser.find_elements(By.ID, "approve")  # decided: no buttons
        finally:
            server.close()
    assert status["phase"] == "Failed", status
    approved = cluster.condition("pcommit", review.plancommit, "Approved") or {}
    assert approved["reason"] == "Rejected" and "alice" in approved["message"]
    assert "<b>not</b> this one" in approved["message"]
    assert (data / "g.txt").read_text() == "d0\n"

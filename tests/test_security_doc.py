"""docs/security.md's threat model names only tests that exist: every cited file is there and
every cited ``::test_name`` is a test function of the file cited before it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREFIXES = {
    "AP/": "tests/operator/apiserver/",
    "UN/": "tests/operator/unit/",
    "AG/": "tests/core/agent/",
    "DP/": "tests/deploy/",
    "e2e/": "e2e/",
}
CITATION = re.compile(r"`((?:AP|UN|AG|DP|e2e)/[\w/]+\.py)?(::test_\w+)?(?:\[[^\]]*\])?`")


def _threat_model() -> str:
    text = (ROOT / "docs" / "security.md").read_text()
    return text.split("## Threat model", 1)[1].split("\n## The rules", 1)[0]


def test_every_cited_test_exists() -> None:
    current: Path | None = None
    cited = 0
    for match in CITATION.finditer(_threat_model()):
        path, name = match.groups()
        if path:
            prefix = next(p for p in PREFIXES if path.startswith(p))
            current = ROOT / (PREFIXES[prefix] + path[len(prefix) :])
            assert current.is_file(), path
            cited += 1
        if name:
            assert current is not None, name
            assert f"def {name[2:]}(" in current.read_text(), (current.name, name)
            cited += 1
    assert cited >= 30, cited

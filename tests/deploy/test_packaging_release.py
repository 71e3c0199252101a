"""A releasable package (issue 11): one version source, a base image pinned by digest, no
package-registry host in any project file, the e2e image build's mirror taken from apt.

pyproject.toml's ``[project] version`` is the one place the version is written: the package reads
it through importlib.metadata, hack/version.sh prints it for the image label (Dockerfile build
argument, e2e/images/build.sh) and Chart.yaml must carry the same value (checked here).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import sandbox_operator
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}\b")


def test_the_version_is_written_once() -> None:
    assert (
        subprocess.run(
            [str(REPO_ROOT / "hack" / "version.sh")], capture_output=True, text=True, check=True
        ).stdout.strip()
        == VERSION
    )
    chart = yaml.safe_load((REPO_ROOT / "charts" / "sandbox-operator" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    assert sandbox_operator.__version__ == VERSION
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    assert "ARG VERSION" in dockerfile
    build = (REPO_ROOT / "e2e" / "images" / "build.sh").read_text()
    assert 'org.opencontainers.image.version="$("$REPO/hack/version.sh")"' in build
    kind = (REPO_ROOT / "e2e" / "kind.sh").read_text()
    assert '--build-arg VERSION="$("$REPO/hack/version.sh")"' in kind
    # No other copy of the version literal in the files that used to hold one.
    for path in ("Dockerfile", "e2e/images/build.sh", "e2e/kind.sh", "tests/deploy/test_chart.py"):
        assert VERSION not in (REPO_ROOT / path).read_text(), path


def test_every_base_image_is_pinned_by_digest() -> None:
    lines = [
        line
        for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("FROM ")
    ]
    assert len(lines) == 2
    for line in lines:
        image = line.split()[1]
        assert image.startswith("python:3.11-slim@"), line
        assert DIGEST.search(image), f"not pinned by digest: {line}"


# Hosts of package registries and mirrors, spelt in parts so that this file names none either.
_HOSTS = [
    ".".join(parts)
    for parts in (
        ("deb", "debian", "org"), ("security", "debian", "org"), ("archive", "ubuntu", "com"),
        ("pypi", "org"), ("files", "pythonhosted", "org"), ("ghcr", "io"), ("quay", "io"),
        ("registry-1", "docker", "io"), ("index", "docker", "io"), ("hub", "docker", "com"),
        ("gcr", "io"), ("registry", "k8s", "io"), ("proxy", "golang", "org"),
        ("public", "ecr", "aws"), ("registry", "npmjs", "org"),
    )
]  # fmt: skip


def test_no_project_file_names_a_package_registry_host() -> None:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    found = []
    for name in files:
        path = REPO_ROOT / name
        if name.startswith("hack/k8s-modules") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [f"{name}: {host}" for host in _HOSTS if host in text]
    assert found == []


def _mirror(suite: str) -> subprocess.CompletedProcess[str]:
    """Run build.sh's ``mirror`` function alone (its helpers, not the build)."""
    script = (REPO_ROOT / "e2e" / "images" / "build.sh").read_text()
    functions = script[script.index("log() {") : script.index("need() {")]
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{functions}\nSUITE={suite}\nmirror"],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def _apt_has_suite(suite: str) -> bool:
    sources = [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list"),
               *Path("/etc/apt/sources.list.d").glob("*.sources")]  # fmt: skip
    return any(
        re.search(rf"(^|\s){suite}(\s|$)", p.read_text(), re.M) for p in sources if p.is_file()
    )


def test_e2e_image_mirror_comes_from_apt_sources() -> None:
    got = _mirror("bookworm")
    if _apt_has_suite("bookworm"):
        assert got.returncode == 0, got.stderr
        assert re.fullmatch(r"https?://\S+", got.stdout.strip())
        apt = "".join(p.read_text() for p in Path("/etc/apt/sources.list.d").glob("*.sources")) + (
            Path("/etc/apt/sources.list").read_text()
            if Path("/etc/apt/sources.list").is_file()
            else ""
        )
        assert got.stdout.strip() in apt
    missing = _mirror("no-such-suite")
    assert missing.returncode != 0
    assert "no Debian mirror for 'no-such-suite'" in missing.stderr
    assert "DEBIAN_MIRROR" in missing.stderr

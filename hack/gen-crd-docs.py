#!/usr/bin/env python3
"""Generate docs/crd-reference.md from the CRD schemas in crds/*.yaml.

Usage:
    hack/gen-crd-docs.py           rewrite docs/crd-reference.md
    hack/gen-crd-docs.py --check   exit 1 (and say so) when the file is not up to date

The CRDs are the source of truth; the reference lists, for every kind, its names, printer
columns, CEL validation rules and every field with type, required flag, default, constraints
and description. tests/deploy/test_crds.py runs ``--check``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = REPO_ROOT / "crds"
OUTPUT = REPO_ROOT / "docs" / "crd-reference.md"
# Order of the kinds in the document: the user's path through them.
KIND_ORDER = ("Sandbox", "Checkpoint", "PlanCommit")
# Standard fields every Kubernetes object has; documented once, not per field.
STANDARD_FIELDS = ("apiVersion", "kind", "metadata")


def load_crds(crd_dir: Path = CRD_DIR) -> list[dict[str, Any]]:
    """All CustomResourceDefinitions in ``crd_dir``, in KIND_ORDER, then by name."""
    crds = []
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                crds.append(doc)

    def order(crd: dict[str, Any]) -> tuple[int, str]:
        kind = crd["spec"]["names"]["kind"]
        rank = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
        return rank, kind

    return sorted(crds, key=order)


def _cell(text: str) -> str:
    """Make text safe for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _type_of(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return "object (any fields)"
    if kind == "array":
        return f"[]{_type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"map[string]{_type_of(schema['additionalProperties'])}"
    if schema.get("format"):
        return f"{kind} ({schema['format']})"
    return str(kind)


def _constraints(schema: dict[str, Any]) -> str:
    parts = []
    if "enum" in schema:
        parts.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    for key, label in (
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
    ):
        if key in schema:
            parts.append(f"{label} {schema[key]}")
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(schema.get("x-kubernetes-list-map-keys", []))
        parts.append(f"list keyed by {keys}")
    for rule in schema.get("x-kubernetes-validations", []):
        parts.append(rule["message"])
    return "; ".join(parts)


def walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Yield (dotted path, schema, required) for every property below ``schema``, depth first.

    Array items are entered with a ``[]`` suffix on the path (``status.conditions[].type``).
    """
    required = set(schema.get("required", []))
    for name, child in schema.get("properties", {}).items():
        child_path = f"{path}.{name}" if path else name
        yield child_path, child, name in required
        yield from walk(child, child_path)
        items = child.get("items")
        if isinstance(items, dict) and items.get("properties"):
            yield from walk(items, f"{child_path}[]")


def _other_versions(spec: dict[str, Any], stored: dict[str, Any]) -> list[str]:
    """One paragraph per other served version: deprecated or not, and whether it has the
    stored version's fields (the same schema, so the API server's None conversion is
    lossless). A version with another schema is refused: this page documents one schema."""
    lines: list[str] = []
    for version in spec["versions"]:
        if version is stored or not version.get("served"):
            continue
        if version["schema"] != stored["schema"]:
            raise SystemExit(
                f"{spec['names']['kind']} {version['name']}: another schema than the stored "
                f"{stored['name']}; document it before serving it"
            )
        state = "served, deprecated" if version.get("deprecated") else "served"
        warning = version.get("deprecationWarning")
        lines += [
            f"Also `{spec['group']}/{version['name']}` ({state}; conversion "
            f"`{spec.get('conversion', {}).get('strategy', 'None')}`): the same fields, "
            "descriptions and rules."
            + (f" Its requests get the warning: {_cell(warning)}" if warning else ""),
            "",
        ]
    return lines


def render_crd(crd: dict[str, Any]) -> list[str]:
    """The Markdown section of one CRD."""
    spec = crd["spec"]
    names = spec["names"]
    lines: list[str] = []
    stored = [v for v in spec["versions"] if v.get("storage")]
    for version in stored:
        root = version["schema"]["openAPIV3Schema"]
        lines += [
            f"## {names['kind']}",
            "",
            f"`{spec['group']}/{version['name']}`, {spec['scope']}. "
            f"Resource `{names['plural']}` (`{crd['metadata']['name']}`), "
            f"short names {', '.join(f'`{s}`' for s in names.get('shortNames', []))}, "
            f"categories {', '.join(f'`{c}`' for c in names.get('categories', []))}. "
            f"Status subresource: {'yes' if 'status' in version.get('subresources', {}) else 'no'}"
            ".",
            "",
            *_other_versions(spec, version),
            _cell(root.get("description", "")),
            "",
            "Printer columns (`kubectl get`; priority 1 only with `-o wide`):",
            "",
            "| Column | Type | Source | Priority | Description |",
            "|---|---|---|---|---|",
        ]
        for column in version.get("additionalPrinterColumns", []):
            lines.append(
                f"| {column['name']} | {column['type']} | `{_cell(column['jsonPath'])}` "
                f"| {column.get('priority', 0)} | {_cell(column.get('description', ''))} |"
            )
        rules = [
            (field_path, rule)
            for field_path, schema, _ in [("", root, False), *walk(root, "")]
            for rule in schema.get("x-kubernetes-validations", [])
        ]
        lines += [
            "",
            "Validation rules (CEL, enforced by the API server):",
            "",
            "| Field | Rule | Message |",
            "|---|---|---|",
        ]
        for field_path, rule in rules:
            where = field_path or "(root)"
            lines.append(f"| `{where}` | `{_cell(rule['rule'])}` | {_cell(rule['message'])} |")
        lines += [
            "",
            "Fields (`apiVersion`, `kind` and `metadata` are the standard object fields):",
            "",
            "| Field | Type | Required | Default | Constraints | Description |",
            "|---|---|---|---|---|---|",
        ]
        for field_path, schema, required in walk(root, ""):
            if field_path in STANDARD_FIELDS:
                continue
            default = f"`{schema['default']}`" if "default" in schema else ""
            lines.append(
                f"| `{field_path}` | {_type_of(schema)} | {'yes' if required else ''} "
                f"| {default} | {_cell(_constraints(schema))} "
                f"| {_cell(schema.get('description', ''))} |"
            )
        lines.append("")
    return lines


def render(crds: list[dict[str, Any]]) -> str:
    """The whole reference document."""
    lines = [
        "# CRD reference",
        "",
        "<!-- Generated by hack/gen-crd-docs.py from crds/*.yaml. Do not edit by hand: change the",
        "     CRDs and run `python hack/gen-crd-docs.py`. -->",
        "",
        "The operator's API: three namespaced kinds in group `sandbox.cleveragents.io`, all in",
        "the category `sandbox-all`: list all three kinds with `kubectl get sandbox-all` (or",
        "`kubectl get sbx,ckpt,pcommit`). There is no category named `sandboxes`: it would make",
        "`kubectl get sandboxes` print kind-prefixed names. `kubectl explain <kind>.<field>`",
        "shows the same descriptions.",
        "",
        "Contents: "
        + ", ".join(
            f"[{c['spec']['names']['kind']}](#{c['spec']['names']['kind'].lower()})" for c in crds
        ),
        "",
    ]
    for crd in crds:
        lines += render_crd(crd)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is outdated")
    args = parser.parse_args(argv)
    text = render(load_crds())
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != text:
            print(
                f"{OUTPUT.relative_to(REPO_ROOT)} is out of date; run hack/gen-crd-docs.py",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

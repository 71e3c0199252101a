"""Boundary algebra: which sandbox governs a resource (seed 002, "Boundary Algebra").

Resources form a forest through ``parent_id`` (a file inside a repository, a repository inside a
directory). A resource is a *boundary* when it names its own sandbox strategy
(``sandbox_strategy`` set and not ``"inherit"``); otherwise it inherits its parent's sandbox.

The sandbox key of a resource is the ``resource_id`` of the **top-most** boundary on its ancestor
chain. Top-most, not nearest: a sandbox of an outer directory already contains every repository
below it, so giving the inner repository a second sandbox would let two sandboxes write the same
files and the later commit would overwrite the earlier one. One subtree, one sandbox.

Example::

    repo = Resource("repo", "/src/repo", sandbox_strategy="git_worktree")
    a = Resource("a", "/src/repo/a.py", parent_id="repo")
    b = Resource("b", "/src/repo/b.py", parent_id="repo")
    resolve_boundary(a, registry).resource_id == resolve_boundary(b, registry).resource_id == "repo"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

INHERIT = "inherit"


@runtime_checkable
class BoundaryResource(Protocol):
    """What the boundary algebra reads from a resource.

    Required: ``resource_id`` (str). Read when present: ``path`` (or ``location``) - the original
    location given to the strategy; ``parent_id`` (str | None); ``sandbox_strategy``
    (str | None, ``None`` or ``"inherit"`` = inherit from the parent); ``sandbox_options``
    (mapping of strategy options).
    """

    @property
    def resource_id(self) -> str: ...


class ResourceLookup(Protocol):
    """A resource registry: ``get(resource_id)`` returns the resource or ``None``."""

    def get(self, resource_id: str) -> Any: ...


@dataclass(frozen=True)
class Resource:
    """A concrete resource for users and tests.

    Attributes:
        resource_id: unique id.
        path: original location (directory, repository root, DSN).
        parent_id: id of the enclosing resource, if any.
        sandbox_strategy: strategy name, or ``None`` / ``"inherit"`` to use the parent's sandbox.
        sandbox_options: strategy options passed to the factory.
    """

    resource_id: str
    path: str
    parent_id: str | None = None
    sandbox_strategy: str | None = None
    sandbox_options: Mapping[str, Any] = field(default_factory=dict)


class ResourceRegistry:
    """In-memory registry of :class:`Resource` (anything with ``resource_id`` works)."""

    def __init__(self, resources: list[Any] | None = None) -> None:
        self._resources: dict[str, Any] = {}
        for resource in resources or []:
            self.add(resource)

    def add(self, resource: Any) -> None:
        """Register (or replace) ``resource`` under its ``resource_id``."""
        self._resources[str(resource.resource_id)] = resource

    def get(self, resource_id: str) -> Any:
        """The resource with ``resource_id``, or ``None``."""
        return self._resources.get(resource_id)


def resource_location(resource: Any) -> str:
    """``resource.path``, else ``resource.location``, else ``""``."""
    for name in ("path", "location"):
        value = getattr(resource, name, None)
        if value:
            return str(value)
    return ""


def resource_strategy(resource: Any) -> str | None:
    """The strategy a resource names for itself, or ``None`` when it inherits."""
    strategy = getattr(resource, "sandbox_strategy", None)
    if strategy is None:
        return None
    text = str(getattr(strategy, "value", strategy))
    return None if not text or text == INHERIT else text


def resolve_boundary(resource: Any, registry: ResourceLookup) -> Any:
    """The top-most boundary resource governing ``resource`` (see the module docstring).

    Raises:
        ValueError: a ``parent_id`` is not in the registry, the parent chain has a cycle, or no
            resource on the chain names a sandbox strategy.
    """
    boundary: Any = None
    seen: set[str] = set()
    current: Any = resource
    while current is not None:
        resource_id = str(current.resource_id)
        if resource_id in seen:
            raise ValueError(f"resource parent chain has a cycle at {resource_id}")
        seen.add(resource_id)
        if resource_strategy(current) is not None:
            boundary = current
        parent_id = getattr(current, "parent_id", None)
        if not parent_id:
            break
        parent = registry.get(str(parent_id))
        if parent is None:
            raise ValueError(f"parent resource {parent_id} of {resource_id} is not registered")
        current = parent
    if boundary is None:
        raise ValueError(
            f"resource {resource.resource_id} has no sandbox strategy and no ancestor with one"
        )
    return boundary

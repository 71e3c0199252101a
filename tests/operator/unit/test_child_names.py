"""Child object names: one Sandbox's Pod, Secret and claim are never another's.

Property: over valid Sandbox names (DNS-1123 subdomains, up to 253 characters, with dots) the
name of a child is a valid DNS-1123 label, a pure function of the Sandbox's name and the
child's suffix, and distinct for distinct names; the regressions are the pairs the old scheme
merged (``.`` against ``-``; names sharing their first 51 characters).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox_api.naming import (
    DNS_LABEL,
    MAX_LABEL,
    child_object_name,
    child_object_names,
    legacy_child_object_name,
)

SUFFIXES = ("ws", "agent", "scratch")

label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
subdomain = (
    st.lists(label, min_size=1, max_size=8).map(".".join).filter(lambda name: len(name) <= 253)
)


def valid_label(name: str) -> bool:
    return len(name) <= MAX_LABEL and DNS_LABEL.fullmatch(name) is not None


@settings(max_examples=400, deadline=None)
@given(a=subdomain, b=subdomain, suffix=st.sampled_from(SUFFIXES))
def test_child_names_are_valid_deterministic_and_distinct(a: str, b: str, suffix: str) -> None:
    name = child_object_name(a, suffix)
    assert valid_label(name), name
    assert child_object_name(a, suffix) == name
    assert name.endswith(f"-{suffix}") and name.startswith("sbx-")
    if a != b:
        assert child_object_name(b, suffix) != name


@settings(max_examples=200, deadline=None)
@given(prefix=subdomain, tail=st.lists(label, min_size=1, max_size=2).map(".".join))
def test_names_that_differ_only_by_dots_or_after_the_cut_get_their_own_children(
    prefix: str, tail: str
) -> None:
    long = (prefix + "-" + "x" * 60)[:200]
    pairs = [
        (f"{prefix}.{tail}", f"{prefix}-{tail}"),
        (f"{long}a", f"{long}b"),
    ]
    for first, second in pairs:
        for suffix in SUFFIXES:
            assert child_object_name(first, suffix) != child_object_name(second, suffix)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("team.x", "team-x"),
        ("plan-" + "a" * 50 + "-repo", "plan-" + "a" * 50 + "-docs"),
    ],
)
def test_the_pairs_the_old_scheme_merged_are_kept_apart(first: str, second: str) -> None:
    for suffix in SUFFIXES:
        assert legacy_child_object_name(first, suffix) == legacy_child_object_name(second, suffix)
        assert child_object_name(first, suffix) != child_object_name(second, suffix)


def test_a_short_name_stays_readable_and_the_legacy_name_is_looked_up_second() -> None:
    name = child_object_name("s-db", "ws")
    assert name.startswith("sbx-s-db-") and len(name) == len("sbx-s-db--ws") + 16
    assert child_object_names("s-db", "ws") == (name, "sbx-s-db-ws")


def test_a_suffix_that_is_no_label_is_refused() -> None:
    with pytest.raises(ValueError, match="suffix"):
        child_object_name("s", "Bad_Suffix")

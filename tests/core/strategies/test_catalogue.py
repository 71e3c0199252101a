"""The static catalogue of strategy traits says what each strategy class says of itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sandbox_core import SandboxFactory
from sandbox_core.strategies.catalogue import CATALOGUE, SandboxStrategy, traits_of


def test_every_builtin_strategy_is_in_the_catalogue() -> None:
    assert set(CATALOGUE) == {strategy.value for strategy in SandboxStrategy}
    assert set(CATALOGUE) == set(SandboxFactory().strategies)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_the_catalogue_agrees_with_the_strategy_class(name: str) -> None:
    cls = SandboxFactory().strategy_class(name)
    assert traits_of(name).rollbackable is bool(cls.rollbackable)
    assert traits_of(name).forkable is bool(cls.forkable)


def test_an_unknown_strategy_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="Unknown sandbox strategy: nope"):
        traits_of("nope")


def test_the_catalogue_loads_no_strategy_code() -> None:
    code = (
        "import sys, sandbox_core.strategies.catalogue\n"
        "names = ('git', 'psycopg', 'sandbox_core.strategies.base')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "assert heavy == [], heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

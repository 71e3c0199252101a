"""BDD scenarios of the git_worktree strategy (steps in this area's conftest.py)."""

from pytest_bdd import scenarios

scenarios("git_worktree.feature")

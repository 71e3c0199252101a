"""fs_utils area: backup_directory, safe_restore, compute_diff, compute_changes, sync_tree."""

from pytest_bdd import scenarios

scenarios("fs_utils.feature")

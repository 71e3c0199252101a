"""copy_on_write area: lifecycle, commit kinds, rollback, cleanup and error wrapping."""

from pytest_bdd import scenarios

scenarios("copy_on_write.feature")

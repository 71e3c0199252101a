"""Strategy transaction_rollback on SQLite and PostgreSQL (seed 002); steps in conftest.py."""

from pytest_bdd import scenarios

scenarios("transaction.feature")

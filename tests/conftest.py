"""Shared pytest configuration for tests/ (fixtures live in the modules that need them)."""

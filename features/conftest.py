"""Shared BDD configuration. Each area keeps its step definitions next to its feature files."""

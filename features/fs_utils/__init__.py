"""Package marker: gives this test module a unique import name (tests/test_fs_utils.py exists)."""

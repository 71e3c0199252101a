"""Package marker: gives this test module a unique import name (test_fs_utils.py was also a
name under tests/)."""

"""The blocking client's tests, generated from ``../_async/`` by hack/unasync.py: do not edit."""

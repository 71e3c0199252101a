"""The client tests written once, for the async client; hack/unasync.py generates ``../_sync/``
from them for the blocking client. Edit these, never the generated copies."""

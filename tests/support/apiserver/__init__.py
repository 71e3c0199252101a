"""Tier-2 test support: real etcd + kube-apiserver on 127.0.0.1, like controller-runtime's envtest.

`LocalApiServer` (in `harness`) starts and stops the pair; `fixtures.local_apiserver` is the
session-scoped pytest fixture. The binaries come from `hack/build-k8s-binaries.sh`
(see docs/k8s-binaries.md).
"""

from tests.support.apiserver.harness import (
    ApiServerHarnessError,
    BinariesNotFoundError,
    LocalApiServer,
    StartupError,
    find_bin_dir,
)

__all__ = [
    "ApiServerHarnessError",
    "BinariesNotFoundError",
    "LocalApiServer",
    "StartupError",
    "find_bin_dir",
]

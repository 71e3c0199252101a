"""Certificates and kubeconfigs of the e2e cluster (`e2e/cluster up`), tier 3.

Reuses the API-server tier's throw-away PKI (`tests/support/apiserver/harness.py`, `_Pki`: the CA,
the admin client certificate in ``system:masters`` and the service-account key pair) and adds what a
whole cluster needs on top:

- an API server serving certificate that also names the node address (the pod bridge's gateway,
  e.g. 10.244.0.1), where the API server listens so that pods can reach it;
- a kubelet client certificate ``system:node:<node>`` in ``system:nodes`` (Node authorizer);
- kubeconfigs for the admin (also used by the controller-manager, scheduler, kube-proxy and the
  volume provisioner) and for the kubelet.

Usage: ``python e2e/pki.py DIR --node-ip 10.244.0.1 --node-name sandbox-e2e --server URL``.
Writes ``DIR/{ca.crt,apiserver.crt,apiserver.key,admin.crt,admin.key,sa.key,sa.pub,
kubelet-client.crt,kubelet-client.key,admin.kubeconfig,kubelet.kubeconfig}`` (mode 0600).
Idempotent: an existing complete DIR is left alone.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID  # noqa: E402

from tests.support.apiserver.harness import (  # noqa: E402
    KUBERNETES_SERVICE_IP,
    _pem_cert,
    _pem_key,
    _Pki,
)

FILES = (
    "ca.crt",
    "apiserver.crt",
    "apiserver.key",
    "admin.crt",
    "admin.key",
    "sa.key",
    "sa.pub",
    "kubelet-client.crt",
    "kubelet-client.key",
    "admin.kubeconfig",
    "kubelet.kubeconfig",
)


def _kubeconfig(server: str, ca: bytes, cert: bytes, key: bytes, user: str) -> str:
    """A one-cluster, one-user kubeconfig with the credentials inline (YAML is JSON's superset)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return (
        "apiVersion: v1\nkind: Config\n"
        "clusters:\n- name: sandbox-e2e\n  cluster:\n"
        f"    server: {server}\n    certificate-authority-data: {b64(ca)}\n"
        f"users:\n- name: {user}\n  user:\n"
        f"    client-certificate-data: {b64(cert)}\n    client-key-data: {b64(key)}\n"
        f"contexts:\n- name: sandbox-e2e\n  context:\n    cluster: sandbox-e2e\n    user: {user}\n"
        "current-context: sandbox-e2e\n"
    )


def generate(directory: Path, node_ip: str, node_name: str, server: str) -> None:
    """Write the cluster's PKI and kubeconfigs into ``directory`` (created, mode 0700)."""
    if all((directory / name).is_file() for name in FILES):
        return
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    pki = _Pki(directory)

    # The serving certificate of the harness names 127.0.0.1 and the Service IP only; the
    # cluster's API server listens on the node address, so sign one that names it too.
    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
        x509.IPAddress(ipaddress.IPv4Address(KUBERNETES_SERVICE_IP)),
        x509.IPAddress(ipaddress.IPv4Address(node_ip)),
    ]
    serving = (
        pki._leaf("kube-apiserver", None, serving_key, ExtendedKeyUsageOID.SERVER_AUTH)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(pki._ca_key, hashes.SHA256())
    )
    pki._write("apiserver.crt", _pem_cert(serving))
    pki._write("apiserver.key", _pem_key(serving_key))

    kubelet_key = ec.generate_private_key(ec.SECP256R1())
    kubelet_cert = pki._leaf(
        f"system:node:{node_name}", "system:nodes", kubelet_key, ExtendedKeyUsageOID.CLIENT_AUTH
    ).sign(pki._ca_key, hashes.SHA256())
    kubelet_cert_pem = _pem_cert(kubelet_cert)
    kubelet_key_pem = _pem_key(kubelet_key)
    pki._write("kubelet-client.crt", kubelet_cert_pem)
    pki._write("kubelet-client.key", kubelet_key_pem)

    ca_pem = _pem_cert(pki.ca_cert)
    node_user = f"system:node:{node_name}"
    kubelet_config = _kubeconfig(server, ca_pem, kubelet_cert_pem, kubelet_key_pem, node_user)
    pki._write("kubelet.kubeconfig", kubelet_config.encode())
    # Written last: its presence marks a complete directory.
    pki._write(
        "admin.kubeconfig",
        _kubeconfig(server, ca_pem, pki.admin_cert_pem, pki.admin_key_pem, "admin").encode(),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--node-ip", required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--server", required=True)
    args = parser.parse_args(argv)
    generate(args.directory, args.node_ip, args.node_name, args.server)
    return 0


if __name__ == "__main__":
    sys.exit(main())

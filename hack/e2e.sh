#!/usr/bin/env bash
# Tier 3: the end-to-end suite on a real single-node cluster built on this machine (e2e/cluster).
# Installs the Debian packages the cluster needs, builds every Kubernetes binary (cached), brings
# the cluster up, runs e2e/ against it and always brings it down again, even on failure.
# Run by hack/test.sh (the README's test command) after tiers 1 and 2; needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(containerd runc containernetworking-plugins debootstrap umoci iptables nftables curl)
missing=()
for pkg in "${packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "e2e: installing ${missing[*]} from Debian"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

echo "e2e: Kubernetes binaries (--all, cached after the first build)"
hack/build-k8s-binaries.sh --all >/dev/null

trap 'echo "e2e: bringing the cluster down"; e2e/cluster down || true' EXIT
e2e/cluster up
eval "$(e2e/cluster env)"
.venv/bin/python -m pytest e2e -p no:cacheprovider -q --timeout=900 "$@"

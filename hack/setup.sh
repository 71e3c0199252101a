#!/usr/bin/env bash
# Set up everything the project needs on a fresh Debian machine (idempotent, safe to re-run):
# system packages, the Python virtualenv with the project installed, PostgreSQL, and the
# Kubernetes binaries (kube-apiserver, etcd, kubectl, helm) built from the Go module proxy.
# Prints nothing but progress; sourcing hack/env.sh afterwards gives the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# bwrap (bubblewrap): the jail an actor's command runs in (docs/actor.md, "Isolation").
for tool in git rsync unshare getfattr bwrap; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
if ((${#need_apt[@]})); then
  pkgs=()
  for tool in "${need_apt[@]}"; do
    case "$tool" in
      unshare) pkgs+=(util-linux) ;;
      getfattr) pkgs+=(attr) ;;
      bwrap) pkgs+=(bubblewrap) ;;
      *) pkgs+=("$tool") ;;
    esac
  done
  echo "setup: installing ${pkgs[*]} from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
echo "setup: installing the project into .venv"
.venv/bin/pip install -q -e '.[operator,test,client]'

if [ -x hack/postgres.sh ]; then
  echo "setup: starting PostgreSQL"
  hack/postgres.sh start >/dev/null
fi
if [ -x hack/build-k8s-binaries.sh ]; then
  echo "setup: Kubernetes binaries (cached after the first build)"
  hack/build-k8s-binaries.sh >/dev/null
fi

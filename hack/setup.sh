#!/usr/bin/env bash
# Set up everything the project needs on a fresh Debian machine (idempotent, safe to re-run):
# system packages, the Python virtualenv with the project installed, PostgreSQL, and the
# Kubernetes binaries (kube-apiserver, kube-scheduler, kube-controller-manager, etcd, kubectl, helm)
# and kube-score built from the Go module proxy.
# Prints nothing but progress; sourcing hack/env.sh afterwards gives the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# bwrap (bubblewrap): the jail an actor's command runs in (docs/actor.md, "Isolation").
# chromium + chromedriver: the review page's tests drive a real headless browser (selenium).
for tool in git rsync unshare getfattr bwrap chromium chromedriver; do
  command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
# The jail sees the system's /usr only: agents' tools call `python` (the Deep Agents backend's
# file tools run Python scripts in the sandbox), which Debian names python3.
[ -e /usr/bin/python ] || need_apt+=(python)
if ((${#need_apt[@]})); then
  pkgs=()
  for tool in "${need_apt[@]}"; do
    case "$tool" in
      unshare) pkgs+=(util-linux) ;;
      getfattr) pkgs+=(attr) ;;
      bwrap) pkgs+=(bubblewrap) ;;
      chromedriver) pkgs+=(chromium-driver) ;;
      python) pkgs+=(python3 python-is-python3) ;;
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
.venv/bin/pip install -q -e '.[operator,test,client,tracing]'
# The framework adapters' tier runs in a virtualenv of its own: the frameworks and their
# conformance suites bring pytest plugins (pytest-asyncio, pytest-socket, ...) and model SDKs
# that the rest of the suite must not load.
if [ ! -x .venv-integrations/bin/python ]; then
  echo "setup: creating .venv-integrations"
  python3 -m venv .venv-integrations
  .venv-integrations/bin/pip install -q --upgrade pip
fi
echo "setup: installing the project and the agent frameworks into .venv-integrations"
.venv-integrations/bin/pip install -q -e '.[operator,client,test,deepagents,openai-agents,integrations-test]'

if [ -x hack/postgres.sh ]; then
  echo "setup: starting PostgreSQL"
  hack/postgres.sh start >/dev/null
fi
if [ -x hack/build-k8s-binaries.sh ]; then
  echo "setup: Kubernetes binaries (cached after the first build)"
  hack/build-k8s-binaries.sh >/dev/null
fi
if [ -x hack/build-kube-score.sh ]; then
  echo "setup: kube-score (cached after the first build)"
  hack/build-kube-score.sh >/dev/null
fi

#!/usr/bin/env bash
# The e2e suite against kind, for a machine with Docker and registry access (the local
# equivalent without either is e2e/cluster). Same suite, same image name, same settings.
#
# Usage: e2e/kind.sh up|down|env
#
#   up    docker build of the project's Dockerfile as localhost/sandbox-operator:e2e, a kind
#         cluster from e2e/kind-config.yaml, the image loaded into its node
#   down  delete the cluster and its kubeconfig
#   env   print `export KUBECONFIG=...` for eval
#
# Then: eval "$(e2e/kind.sh env)" && .venv/bin/python -m pytest e2e -p no:cacheprovider
# (kubectl and helm from PATH).
#
# Environment: KIND_NODE_IMAGE (node image, default kind's), KIND (kind binary, default kind).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
NAME="sandbox-e2e"
IMAGE="localhost/sandbox-operator:e2e"
KIND="${KIND:-kind}"
KUBECONFIG_PATH="${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-operator/kind-$NAME.kubeconfig"

log() { echo "e2e-kind: $*" >&2; }

up() {
    command -v docker >/dev/null || { log "docker is missing"; exit 1; }
    command -v "$KIND" >/dev/null || { log "kind is missing (go install sigs.k8s.io/kind@latest)"; exit 1; }
    log "docker build $IMAGE"
    docker build --build-arg VERSION="$("$REPO/hack/version.sh")" -t "$IMAGE" "$REPO"
    if ! "$KIND" get clusters | grep -qx "$NAME"; then
        args=(create cluster --name "$NAME" --config "$HERE/kind-config.yaml" --wait 180s)
        [[ -n "${KIND_NODE_IMAGE:-}" ]] && args+=(--image "$KIND_NODE_IMAGE")
        "$KIND" "${args[@]}"
    fi
    "$KIND" load docker-image "$IMAGE" --name "$NAME"
    mkdir -p "$(dirname "$KUBECONFIG_PATH")"
    "$KIND" get kubeconfig --name "$NAME" >"$KUBECONFIG_PATH"
    log "ready; eval \"\$(e2e/kind.sh env)\""
}

down() {
    "$KIND" delete cluster --name "$NAME"
    rm -f "$KUBECONFIG_PATH"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    env) echo "export KUBECONFIG=$KUBECONFIG_PATH" ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac

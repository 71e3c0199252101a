#!/usr/bin/env bash
# Build the Kubernetes binaries the tests need (kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl, etcd, helm and, with --all, kubelet, kube-proxy and a
# NetworkPolicy controller) from the Go module proxy only, and cache them outside the repository.
#
# Usage: hack/build-k8s-binaries.sh [--all] [--force] [--help]
#
#   --all     also build kubelet, kube-proxy and kube-network-policies (the e2e cluster's
#             NetworkPolicy enforcement)
#   --force   rebuild even when the cache is warm
#
# Environment:
#   K8S_VERSION         Kubernetes version           (default v1.35.4)
#   ETCD_VERSION        etcd server version          (default v3.6.16)
#   HELM_VERSION        helm version                 (default v3.22.0)
#   NETPOL_VERSION      sigs.k8s.io/kube-network-policies version (default v0.8.0)
#   SANDBOX_K8S_CACHE   cache root (default $HOME/.cache/sandbox-operator/k8s)
#
# Binaries land in "$SANDBOX_K8S_CACHE/<K8S_VERSION>/bin". All progress goes to stderr;
# the only line on stdout is that bin directory, printed last, so callers can do
#   BIN=$(hack/build-k8s-binaries.sh | tail -1)
#
# Why a scratch module: k8s.io/kubernetes requires its staging modules (k8s.io/api,
# k8s.io/client-go, ...) at v0.0.0 and replaces them with ./staging/src/k8s.io/* - directories
# that are not part of its module zip. `go install k8s.io/kubernetes/cmd/...@vX` therefore
# refuses. A scratch module that requires k8s.io/kubernetes and replaces every staging
# module by its published v0.<minor>.<patch> tag builds fine. The replace list is read from
# the kubernetes go.mod itself, so it follows the version. See docs/k8s-binaries.md.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
NETPOL_VERSION="${NETPOL_VERSION:-v0.8.0}"
# Applied to kube-network-policies before the build (docs/testing-tiers.md, "NetworkPolicy").
NETPOL_PATCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/patches/kube-network-policies-$NETPOL_VERSION.patch"
CACHE_ROOT="${SANDBOX_K8S_CACHE:-$HOME/.cache/sandbox-operator/k8s}"
# Bump when the way binaries are built changes, so warm caches are rebuilt.
RECIPE=1

ALL=0
FORCE=0
for arg in "$@"; do
    case "$arg" in
        --all) ALL=1 ;;
        --force) FORCE=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
            exit 0
            ;;
        *)
            echo "build-k8s-binaries: unknown argument: $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

log() { echo "build-k8s-binaries: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

command -v go >/dev/null || die "go is not on PATH"
[[ "$K8S_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.35.4, got $K8S_VERSION"
K8S_MINOR="${BASH_REMATCH[1]}"
K8S_PATCH="${BASH_REMATCH[2]}"
STAGING_VERSION="v0.${K8S_MINOR}.${K8S_PATCH}"

# Keep the toolchain the machine has unless the caller asked for another one.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0
GO_VERSION="$(go env GOVERSION)"

VERSION_DIR="$CACHE_ROOT/$K8S_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$VERSION_DIR/stamp"
MOD_DIR="$VERSION_DIR/modules"
mkdir -p "$BIN_DIR" "$MOD_DIR"

# The scheduler and controller-manager run in the multi-node test tier
# (tests/support/apiserver/multinode.py), so every machine that runs the tests builds them.
CORE_BINS=(kube-apiserver kubectl kube-scheduler kube-controller-manager)
ALL_BINS=(kubelet kube-proxy)
ETCD_BINS=(etcd etcdctl)
HELM_BINS=(helm)
NETPOL_BINS=(kube-network-policies)

# One stamp line per component: "<component> <key>". The key changes whenever the
# binaries of that component would come out different.
key_for() {
    case "$1" in
        k8s-core | k8s-all) echo "k8s=$K8S_VERSION go=$GO_VERSION recipe=$RECIPE" ;;
        etcd) echo "etcd=$ETCD_VERSION go=$GO_VERSION recipe=$RECIPE" ;;
        helm) echo "helm=$HELM_VERSION go=$GO_VERSION recipe=$RECIPE" ;;
        netpol) echo "netpol=$NETPOL_VERSION patch=$(sha256sum <"$NETPOL_PATCH" | cut -c1-16) go=$GO_VERSION recipe=$RECIPE" ;;
    esac
}

bins_for() {
    case "$1" in
        k8s-core) echo "${CORE_BINS[*]}" ;;
        k8s-all) echo "${ALL_BINS[*]}" ;;
        etcd) echo "${ETCD_BINS[*]}" ;;
        helm) echo "${HELM_BINS[*]}" ;;
        netpol) echo "${NETPOL_BINS[*]}" ;;
    esac
}

is_fresh() {
    local component="$1" bin
    [[ "$FORCE" == 1 ]] && return 1
    [[ -f "$STAMP" ]] || return 1
    grep -qxF "$component $(key_for "$component")" "$STAMP" || return 1
    for bin in $(bins_for "$component"); do
        [[ -x "$BIN_DIR/$bin" ]] || return 1
    done
    return 0
}

mark_fresh() {
    local component="$1" tmp
    tmp="$(mktemp "$VERSION_DIR/stamp.XXXXXX")"
    if [[ -f "$STAMP" ]]; then
        grep -v "^$component " "$STAMP" >"$tmp" || true
    fi
    echo "$component $(key_for "$component")" >>"$tmp"
    mv -f "$tmp" "$STAMP"
}

COMPONENTS=(etcd helm k8s-core)
[[ "$ALL" == 1 ]] && COMPONENTS+=(k8s-all netpol)

# Fast path: everything is there, no lock, no go invocations beyond `go env`.
stale=()
for c in "${COMPONENTS[@]}"; do
    is_fresh "$c" || stale+=("$c")
done
if [[ ${#stale[@]} -eq 0 ]]; then
    log "cache is warm ($BIN_DIR)"
    echo "$BIN_DIR"
    exit 0
fi

# Serialise concurrent builds of the same version (parallel test runs, CI).
exec 9>"$VERSION_DIR/.lock"
if ! flock -n 9; then
    log "another build holds $VERSION_DIR/.lock; waiting"
    flock 9
fi

# Move freshly built binaries into BIN_DIR atomically (rename within one filesystem).
install_bins() {
    local from="$1" bin
    shift
    for bin in "$@"; do
        [[ -x "$from/$bin" ]] || die "expected $from/$bin after the build"
        mv -f "$from/$bin" "$BIN_DIR/$bin"
    done
}

# --- Kubernetes -----------------------------------------------------------------------

K8S_MOD="$MOD_DIR/kubernetes"

prepare_k8s_module() {
    if [[ -f "$K8S_MOD/go.sum" && -f "$K8S_MOD/.prepared" ]] &&
        grep -qxF "$(key_for k8s-core)" "$K8S_MOD/.prepared"; then
        return
    fi
    log "preparing scratch module for k8s.io/kubernetes $K8S_VERSION in $K8S_MOD"
    rm -rf "$K8S_MOD"
    mkdir -p "$K8S_MOD"

    local info gomod go_line
    info="$(cd "$K8S_MOD" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION")" ||
        die "cannot download k8s.io/kubernetes@$K8S_VERSION from the module proxy"
    gomod="$(jq -r .GoMod <<<"$info")"
    [[ -f "$gomod" ]] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION ($gomod)"
    go_line="$(go mod edit -json "$gomod" | jq -r .Go)"

    (
        cd "$K8S_MOD"
        cat >go.mod <<EOF
// Generated by hack/build-k8s-binaries.sh; do not edit.
module sandbox-operator.local/k8s-binaries

go $go_line
EOF
        go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
        # Every module that kubernetes replaces with a ./staging directory gets replaced
        # by its published tag instead.
        local staging
        staging="$(go mod edit -json "$gomod" |
            jq -r '.Replace[]? | select(.New.Path | startswith("./staging/")) | .Old.Path' | sort -u)"
        [[ -n "$staging" ]] || die "found no ./staging replace directives in $gomod"
        local replace_args=() m
        for m in $staging; do
            replace_args+=("-replace=$m=$m@$STAGING_VERSION")
        done
        go mod edit "${replace_args[@]}"
        log "replaced $(wc -w <<<"$staging") staging modules with @$STAGING_VERSION"

        {
            echo "//go:build tools"
            echo
            echo "// Package tools pins the commands built by hack/build-k8s-binaries.sh."
            echo "package tools"
            echo
            echo "import ("
            for b in "${CORE_BINS[@]}" "${ALL_BINS[@]}"; do
                echo "	_ \"k8s.io/kubernetes/cmd/$b\""
            done
            echo ")"
        } >tools.go
        log "go mod tidy (downloads the dependency graph on a cold module cache)"
        go mod tidy
    )
    key_for k8s-core >"$K8S_MOD/.prepared"
}

k8s_ldflags() {
    local build_date info_file
    # The release time recorded by the module proxy: reproducible, unlike `date`.
    info_file="$(cd "$K8S_MOD" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r .Info)"
    build_date="$(jq -r .Time "$info_file")"
    local flags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$K8S_VERSION"
        flags+=" -X $pkg.gitMajor=1"
        flags+=" -X $pkg.gitMinor=$K8S_MINOR"
        # The proxy does not serve the commit; "archive" is what kubernetes itself
        # reports when it is built from a source archive without git metadata.
        flags+=" -X $pkg.gitCommit=0000000000000000000000000000000000000000"
        flags+=" -X $pkg.gitTreeState=archive"
        flags+=" -X $pkg.buildDate=$build_date"
    done
    echo "$flags"
}

build_k8s() {
    local component="$1"
    local -a bins
    read -r -a bins <<<"$(bins_for "$component")"
    prepare_k8s_module
    local out pkgs=() b start
    out="$(mktemp -d "$VERSION_DIR/build.XXXXXX")"
    for b in "${bins[@]}"; do
        pkgs+=("k8s.io/kubernetes/cmd/$b")
    done
    start=$SECONDS
    log "building ${bins[*]} $K8S_VERSION with $GO_VERSION (cold: many minutes)"
    (cd "$K8S_MOD" && go build -trimpath -ldflags "$(k8s_ldflags)" -o "$out/" "${pkgs[@]}")
    install_bins "$out" "${bins[@]}"
    rm -rf "$out"
    mark_fresh "$component"
    log "built ${bins[*]} in $((SECONDS - start))s"
}

# --- etcd -------------------------------------------------------------------------------

build_etcd() {
    local mod="$MOD_DIR/etcd" out start
    start=$SECONDS
    log "building etcd $ETCD_VERSION"
    rm -rf "$mod"
    mkdir -p "$mod"
    out="$(mktemp -d "$VERSION_DIR/build.XXXXXX")"
    (
        cd "$mod"
        # go.etcd.io/etcd/server/v3 replaces its sibling modules with ../api etc., so
        # `go install` refuses it too; as a dependency of a scratch module those
        # replaces are ignored and the published sibling tags are used.
        cat >go.mod <<EOF
// Generated by hack/build-k8s-binaries.sh; do not edit.
module sandbox-operator.local/etcd-binaries

go 1.25.0
EOF
        cat >tools.go <<'EOF'
//go:build tools

// Package tools pins the commands built by hack/build-k8s-binaries.sh.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
EOF
        go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" \
            -require="go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION"
        # The tidy may raise the go line to what the dependencies need.
        go mod tidy
        go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3
        go build -trimpath -ldflags "-s -w" -o "$out/etcdctl" go.etcd.io/etcd/etcdctl/v3
    )
    install_bins "$out" "${ETCD_BINS[@]}"
    rm -rf "$out"
    mark_fresh etcd
    log "built etcd, etcdctl in $((SECONDS - start))s"
}

# --- helm -------------------------------------------------------------------------------

build_helm() {
    local out start
    start=$SECONDS
    log "building helm $HELM_VERSION"
    out="$(mktemp -d "$VERSION_DIR/build.XXXXXX")"
    # helm's go.mod has no replace directives: a plain `go install` works.
    GOBIN="$out" go install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
    install_bins "$out" "${HELM_BINS[@]}"
    rm -rf "$out"
    mark_fresh helm
    log "built helm in $((SECONDS - start))s"
}

# --- kube-network-policies ----------------------------------------------------------------

# The SIG Network NetworkPolicy controller (nfqueue + nftables), run by e2e/cluster as a host
# process. Two small changes are patched in (hack/patches/): packets go to the nfqueue through
# the xtables NFQUEUE target (nft_compat) because kernels without CONFIG_NFT_QUEUE, like this
# machine's, refuse the native nftables queue expression; and a --kubeconfig flag, because the
# upstream binary only knows the in-cluster configuration of a Pod.
build_netpol() {
    local mod="$MOD_DIR/kube-network-policies" out start info src
    start=$SECONDS
    log "building kube-network-policies $NETPOL_VERSION"
    [[ -f "$NETPOL_PATCH" ]] || die "no patch for kube-network-policies $NETPOL_VERSION ($NETPOL_PATCH)"
    info="$(cd "$MOD_DIR" && go mod download -json "sigs.k8s.io/kube-network-policies@$NETPOL_VERSION")" ||
        die "cannot download sigs.k8s.io/kube-network-policies@$NETPOL_VERSION from the module proxy"
    src="$(jq -r .Dir <<<"$info")"
    rm -rf "$mod"
    cp -r "$src" "$mod"
    chmod -R u+w "$mod"
    out="$(mktemp -d "$VERSION_DIR/build.XXXXXX")"
    (
        cd "$mod"
        git apply --whitespace=nowarn "$NETPOL_PATCH"
        # -mod=mod: the patch imports a client-go package the upstream go.sum may not list.
        go build -mod=mod -trimpath -ldflags "-s -w" -o "$out/kube-network-policies" ./cmd
    )
    install_bins "$out" "${NETPOL_BINS[@]}"
    rm -rf "$out"
    mark_fresh netpol
    log "built kube-network-policies in $((SECONDS - start))s"
}

total_start=$SECONDS
for c in "${stale[@]}"; do
    # Another run may have built it while we waited for the lock.
    if is_fresh "$c"; then
        continue
    fi
    case "$c" in
        k8s-core | k8s-all) build_k8s "$c" ;;
        etcd) build_etcd ;;
        helm) build_helm ;;
        netpol) build_netpol ;;
    esac
done
log "done in $((SECONDS - total_start))s; binaries in $BIN_DIR"
echo "$BIN_DIR"

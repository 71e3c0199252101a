#!/usr/bin/env bash
# Build kube-score (github.com/zegl/kube-score, a static checker of Kubernetes manifests) from
# the Go module proxy only, with the machine's own Go settings (GOPROXY, GOFLAGS, ...), and
# cache it outside the repository. tests/deploy/test_kube_score.py runs it on the rendered chart.
#
# Usage: hack/build-kube-score.sh [--force] [--help]
#
#   --force   rebuild even when the cache is warm
#
# Environment:
#   KUBE_SCORE_VERSION  kube-score version            (default v1.20.0)
#   SANDBOX_TOOLS_CACHE cache root (default $HOME/.cache/sandbox-operator/tools)
#
# The binary lands in "$SANDBOX_TOOLS_CACHE/kube-score-<version>/bin/kube-score". All progress
# goes to stderr; the only line on stdout is that bin directory, printed last, so callers can do
#   BIN=$(hack/build-kube-score.sh | tail -1)
set -euo pipefail

KUBE_SCORE_VERSION="${KUBE_SCORE_VERSION:-v1.20.0}"
CACHE_ROOT="${SANDBOX_TOOLS_CACHE:-$HOME/.cache/sandbox-operator/tools}"
# Bump when the way the binary is built changes, so warm caches are rebuilt.
RECIPE=1

FORCE=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
            exit 0
            ;;
        *)
            echo "build-kube-score: unknown argument: $arg (try --help)" >&2
            exit 2
            ;;
    esac
done

log() { echo "build-kube-score: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

command -v go >/dev/null || die "go is not on PATH"
[[ "$KUBE_SCORE_VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
    die "KUBE_SCORE_VERSION must look like v1.20.0, got $KUBE_SCORE_VERSION"

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED=0
GO_VERSION="$(go env GOVERSION)"

VERSION_DIR="$CACHE_ROOT/kube-score-$KUBE_SCORE_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$VERSION_DIR/stamp"
KEY="kube-score=$KUBE_SCORE_VERSION go=$GO_VERSION recipe=$RECIPE"
mkdir -p "$BIN_DIR"

is_fresh() {
    [[ "$FORCE" == 0 && -x "$BIN_DIR/kube-score" && -f "$STAMP" ]] && grep -qxF "$KEY" "$STAMP"
}

if is_fresh; then
    log "cache is warm ($BIN_DIR)"
    echo "$BIN_DIR"
    exit 0
fi

# Serialise concurrent builds (parallel test runs, CI).
exec 9>"$VERSION_DIR/.lock"
if ! flock -n 9; then
    log "another build holds $VERSION_DIR/.lock; waiting"
    flock 9
fi
if is_fresh; then
    echo "$BIN_DIR"
    exit 0
fi

start=$SECONDS
out="$(mktemp -d "$VERSION_DIR/build.XXXXXX")"
trap 'rm -rf "$out"' EXIT
log "building kube-score $KUBE_SCORE_VERSION with $GO_VERSION"
# kube-score's go.mod has no replace directives: a plain `go install` works. The version
# variables are the ones its release tooling sets.
GOBIN="$out" go install -trimpath \
    -ldflags "-s -w -X main.version=${KUBE_SCORE_VERSION#v} -X main.commit=module-proxy" \
    "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION"
[[ -x "$out/kube-score" ]] || die "expected $out/kube-score after the build"
mv -f "$out/kube-score" "$BIN_DIR/kube-score"
echo "$KEY" >"$STAMP"
log "built kube-score in $((SECONDS - start))s; binary in $BIN_DIR"
echo "$BIN_DIR"

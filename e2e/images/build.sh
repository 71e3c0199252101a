#!/usr/bin/env bash
# Build the e2e cluster's container images locally, with no registry: a Debian base made by
# debootstrap, the pod sandbox ("pause") image and the project's one image (operator plus
# workspace). Each comes out as an OCI image-layout tarball that `ctr images import` reads.
#
# Usage: e2e/images/build.sh [pause|base|project|postgres|all]... [--force]
#
# Prints one line per image on stdout, "<image name> <tarball>", e.g.
#   localhost/sandbox-e2e/pause:3.10 /root/.cache/sandbox-operator/e2e/images/pause.tar
#
# Environment:
#   SANDBOX_E2E_CACHE   cache root (default $HOME/.cache/sandbox-operator/e2e)
#   DEBIAN_MIRROR       debootstrap mirror (default: the mirror apt's sources use for the suite)
#   PYTHON              Python that builds the wheels (default: the repo's .venv/bin/python)
#
# Tools and why (docs/testing-tiers.md, "Images"): debootstrap makes the root filesystem,
# a chroot installs the project into it, umoci turns a tar of it into an OCI image. No daemon
# runs and the build needs no network inside the image: the wheels are built on the host with
# the host's pip. `docker build` of the Dockerfile is not used here because its base image
# (python:3.11-slim) lives in a registry this machine cannot reach and dockerd would bring a
# second containerd and its own bridge and iptables rules; the steps below mirror the
# Dockerfile's runtime stage line by line (same packages, user 65532, git config, PATH,
# entrypoint) on Debian 12's python3 (3.11). On a machine with Docker, e2e/kind.sh uses
# `docker build` of the Dockerfile instead.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${SANDBOX_E2E_CACHE:-$HOME/.cache/sandbox-operator/e2e}"
OUT="$CACHE/images"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"

PAUSE_IMAGE="localhost/sandbox-e2e/pause:3.10"
BASE_IMAGE="localhost/sandbox-e2e/debian:bookworm"
PROJECT_IMAGE="localhost/sandbox-operator:e2e"
POSTGRES_IMAGE="localhost/sandbox-e2e/postgres:15"
# The Dockerfile's runtime packages, plus python3 itself (the Dockerfile's base image has it).
BASE_PACKAGES="python3,python3-venv,python-is-python3,git,rsync,tini,ca-certificates,bubblewrap"
SUITE="bookworm"
# Fixed timestamps make the image digests depend on the content only.
EPOCH="2026-01-01T00:00:00Z"

log() { echo "e2e-images: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# The Debian mirror this machine's apt already uses for $SUITE: the first enabled "deb" entry of
# /etc/apt/sources.list and sources.list.d/*.list (one-line format) or *.sources (deb822) whose
# suites include $SUITE. No mirror is built in (no project file names a package host): with none
# configured the build stops and says how to give one.
mirror() {
    if [[ -n "${DEBIAN_MIRROR:-}" ]]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local found
    found="$(SUITE="$SUITE" python3 - <<'PY'
import glob, os, re
suite = os.environ["SUITE"]
def entries():
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        if os.path.isfile(path):
            for line in open(path, errors="replace"):
                line = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
                if len(line) >= 3 and line[0] == "deb":
                    yield "yes", [line[1]], [line[2]]
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for stanza in re.split(r"\n\s*\n", open(path, errors="replace").read()):
            fields = {}
            for line in stanza.splitlines():
                key, sep, value = line.partition(":")
                if sep and not line.startswith(("#", " ", "\t")):
                    fields[key.strip().lower()] = value.split()
            if "deb" in fields.get("types", []):
                enabled = (fields.get("enabled") or ["yes"])[0].lower()
                yield enabled, fields.get("uris", []), fields.get("suites", [])
for enabled, uris, suites in entries():
    if enabled in ("yes", "true") and suite in suites:
        for uri in uris:
            if re.match(r"https?://", uri):
                print(uri.rstrip("/"))
                raise SystemExit(0)
PY
)"
    [[ -n "$found" ]] || die "no Debian mirror for '$SUITE' in /etc/apt/sources.list or \
/etc/apt/sources.list.d/ (*.list, *.sources); add one there or set DEBIAN_MIRROR=<mirror URL>"
    echo "$found"
}

need() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "$tool is missing (apt-get install debootstrap umoci)"
    done
}

# tar_layout DIR TARBALL: an OCI image layout directory as one tarball, written atomically.
tar_layout() {
    local layout="$1" tarball="$2"
    # umoci config leaves the superseded config and manifest blobs behind.
    umoci gc --layout "$layout"
    tar --sort=name --mtime="$EPOCH" --owner=0 --group=0 --numeric-owner \
        -C "$layout" -cf "$tarball.tmp" .
    mv -f "$tarball.tmp" "$tarball"
}

# tar_rootfs DIR TARBALL: a root filesystem as one uncompressed layer.
tar_rootfs() {
    local rootfs="$1" tarball="$2"
    tar --sort=name --numeric-owner --xattrs -C "$rootfs" -cf "$tarball" .
}

stamp_ok() { [[ "$FORCE" == 0 && -f "$1" && -f "$2" ]] && [[ "$(cat "$1")" == "$3" ]]; }

# --- pause ---------------------------------------------------------------------------------

build_pause() {
    local tarball="$OUT/pause.tar" stamp="$OUT/pause.stamp" key work
    need umoci go
    key="pause $(sha256sum "$HERE/pause/main.go" "$HERE/pause/go.mod" "$0" | sha256sum | cut -c1-16)"
    if stamp_ok "$stamp" "$tarball" "$key"; then
        log "pause image is cached ($tarball)"
    else
        log "building the pause image"
        work="$(mktemp -d "$OUT/pause.XXXXXX")"
        mkdir -p "$work/rootfs"
        (cd "$HERE/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
            go build -trimpath -ldflags "-s -w" -o "$work/rootfs/pause" .)
        tar --numeric-owner --owner=0 --group=0 --mtime="$EPOCH" -C "$work/rootfs" -cf "$work/layer.tar" pause
        umoci init --layout "$work/oci"
        umoci new --image "$work/oci:3.10"
        umoci raw add-layer --image "$work/oci:3.10" --history.created "$EPOCH" "$work/layer.tar"
        umoci config --image "$work/oci:3.10" --created "$EPOCH" --history.created "$EPOCH" \
            --config.entrypoint /pause --config.user 65535:65535 --architecture amd64 --os linux
        tar_layout "$work/oci" "$tarball"
        rm -rf "$work"
        echo "$key" >"$stamp"
    fi
    echo "$PAUSE_IMAGE $tarball"
}

# --- Debian base -----------------------------------------------------------------------------

BASE_ROOTFS="$CACHE/rootfs/$SUITE"

build_base_rootfs() {
    local stamp="$CACHE/rootfs/$SUITE.stamp" key="$SUITE $BASE_PACKAGES"
    if stamp_ok "$stamp" "$BASE_ROOTFS/etc/os-release" "$key"; then
        log "debootstrap root filesystem is cached ($BASE_ROOTFS)"
        return
    fi
    need debootstrap
    local start=$SECONDS tmp="$BASE_ROOTFS.tmp"
    log "debootstrap $SUITE ($BASE_PACKAGES) from $(mirror) (cold: a few minutes)"
    rm -rf "$tmp"
    mkdir -p "$(dirname "$BASE_ROOTFS")"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$tmp" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1 ||
        die "debootstrap failed; see $CACHE/debootstrap.log"
    # Trim what an image does not need: apt lists and caches, docs, man pages.
    rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb \
        "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/usr/share/info/*
    rm -rf "$BASE_ROOTFS"
    mv "$tmp" "$BASE_ROOTFS"
    echo "$key" >"$stamp"
    log "debootstrap done in $((SECONDS - start))s"
}

build_base() {
    local tarball="$OUT/debian-base.tar" stamp="$OUT/debian-base.stamp" key work
    build_base_rootfs
    key="base $(cat "$CACHE/rootfs/$SUITE.stamp") $(sha256sum "$0" | cut -c1-16)"
    if stamp_ok "$stamp" "$tarball" "$key"; then
        log "Debian base image is cached ($tarball)"
    else
        need umoci
        log "packing the Debian base image"
        work="$(mktemp -d "$OUT/base.XXXXXX")"
        tar_rootfs "$BASE_ROOTFS" "$work/layer.tar"
        umoci init --layout "$work/oci"
        umoci new --image "$work/oci:bookworm"
        umoci raw add-layer --image "$work/oci:bookworm" --history.created "$EPOCH" "$work/layer.tar"
        umoci config --image "$work/oci:bookworm" --created "$EPOCH" --history.created "$EPOCH" \
            --config.cmd /bin/bash --architecture amd64 --os linux
        tar_layout "$work/oci" "$tarball"
        rm -rf "$work"
        echo "$key" >"$stamp"
    fi
    echo "$BASE_IMAGE $tarball"
}

# --- PostgreSQL (tier 3 database sandboxes) ---------------------------------------------------

# Debian 12's PostgreSQL 15 from its own debootstrap (the project image stays as small as the
# Dockerfile's). The entrypoint initialises an empty data directory once, with the superuser
# password from $POSTGRES_PASSWORD (an env var the Pod fills from a Secret), UTF8 (minbase has
# no locale: initdb would pick SQL_ASCII, whose text psycopg returns as bytes), password logins
# from the pod network, and max_prepared_transactions above zero for the two-phase commit.
POSTGRES_PACKAGES="postgresql-15,tini"
POSTGRES_ROOTFS="$CACHE/rootfs/$SUITE-postgres"

POSTGRES_ENTRYPOINT='#!/bin/sh
# PostgreSQL for the e2e suite: init once into $PGDATA, then run in the foreground.
set -eu
: "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
BIN=/usr/lib/postgresql/15/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
    pwfile=$(mktemp) && printf "%s" "$POSTGRES_PASSWORD" >"$pwfile"
    "$BIN/initdb" -D "$PGDATA" -U postgres --pwfile="$pwfile" -E UTF8 --locale=C --auth-local=trust \
        --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
fi
exec "$BIN/postgres" -D "$PGDATA" -c listen_addresses="*" \
    -c max_prepared_transactions="${POSTGRES_MAX_PREPARED:-64}" \
    -c unix_socket_directories=/tmp -c fsync=off
'

build_postgres() {
    local tarball="$OUT/postgres.tar" stamp="$OUT/postgres.stamp" rstamp="$POSTGRES_ROOTFS.stamp"
    local key work uid tmp start=$SECONDS
    if ! stamp_ok "$rstamp" "$POSTGRES_ROOTFS/etc/os-release" "$SUITE $POSTGRES_PACKAGES"; then
        need debootstrap
        tmp="$POSTGRES_ROOTFS.tmp"
        log "debootstrap $SUITE ($POSTGRES_PACKAGES) from $(mirror) (cold: a few minutes)"
        rm -rf "$tmp"
        mkdir -p "$(dirname "$POSTGRES_ROOTFS")"
        debootstrap --variant=minbase --include="$POSTGRES_PACKAGES" "$SUITE" "$tmp" "$(mirror)" \
            >"$CACHE/debootstrap-postgres.log" 2>&1 ||
            die "debootstrap failed; see $CACHE/debootstrap-postgres.log"
        rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/*.bin "$tmp"/var/cache/apt/archives/*.deb \
            "$tmp"/usr/share/doc/* "$tmp"/usr/share/man/* "$tmp"/usr/share/info/*
        # The package's own cluster is not used: the entrypoint makes one in $PGDATA.
        rm -rf "$tmp"/var/lib/postgresql/15 "$tmp"/etc/postgresql/15
        rm -rf "$POSTGRES_ROOTFS"
        mv "$tmp" "$POSTGRES_ROOTFS"
        echo "$SUITE $POSTGRES_PACKAGES" >"$rstamp"
    fi
    key="postgres $(cat "$rstamp") $(sha256sum "$0" | cut -c1-16)"
    if stamp_ok "$stamp" "$tarball" "$key"; then
        log "PostgreSQL image is cached ($tarball)"
    else
        need umoci
        log "packing the PostgreSQL image"
        work="$(mktemp -d "$OUT/postgres.XXXXXX")"
        printf '%s' "$POSTGRES_ENTRYPOINT" >"$POSTGRES_ROOTFS/usr/local/bin/e2e-postgres"
        chmod 0755 "$POSTGRES_ROOTFS/usr/local/bin/e2e-postgres"
        uid="$(awk -F: '$1 == "postgres" {print $3 ":" $4}' "$POSTGRES_ROOTFS/etc/passwd")"
        [[ -n "$uid" ]] || die "no postgres user in $POSTGRES_ROOTFS"
        tar_rootfs "$POSTGRES_ROOTFS" "$work/layer.tar"
        umoci init --layout "$work/oci"
        umoci new --image "$work/oci:15"
        umoci raw add-layer --image "$work/oci:15" --history.created "$EPOCH" "$work/layer.tar"
        umoci config --image "$work/oci:15" --created "$EPOCH" --history.created "$EPOCH" \
            --architecture amd64 --os linux --config.user "$uid" \
            --config.env PATH=/usr/lib/postgresql/15/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --config.env PGDATA=/var/lib/postgresql/data --config.exposedports 5432/tcp \
            --config.entrypoint /usr/bin/tini --config.entrypoint -- \
            --config.cmd /usr/local/bin/e2e-postgres
        tar_layout "$work/oci" "$tarball"
        rm -rf "$work"
        echo "$key" >"$stamp"
        log "PostgreSQL image built in $((SECONDS - start))s"
    fi
    echo "$POSTGRES_IMAGE $tarball"
}

# --- the project's image ---------------------------------------------------------------------

# The inputs of the project image: any change rebuilds it.
project_key() {
    (
        cd "$REPO"
        git ls-files -s pyproject.toml README.md sandbox_core sandbox_api operator Dockerfile 2>/dev/null
        # Uncommitted edits count too.
        git diff --no-ext-diff HEAD -- pyproject.toml README.md sandbox_core sandbox_api operator 2>/dev/null
        sha256sum "$0"
        cat "$CACHE/rootfs/$SUITE.stamp"
    ) | sha256sum | cut -c1-16
}

PROJECT_MOUNTS=()
cleanup_mounts() {
    local m
    for ((i = ${#PROJECT_MOUNTS[@]} - 1; i >= 0; i--)); do
        m="${PROJECT_MOUNTS[$i]}"
        umount -l "$m" 2>/dev/null || true
    done
    PROJECT_MOUNTS=()
}

build_project() {
    local tarball="$OUT/project.tar" stamp="$OUT/project.stamp" key work rootfs start=$SECONDS
    build_base_rootfs
    key="project $(project_key)"
    if stamp_ok "$stamp" "$tarball" "$key"; then
        log "project image is cached ($tarball)"
        echo "$PROJECT_IMAGE $tarball"
        return
    fi
    need umoci
    [[ -x "$PYTHON" ]] || die "no Python at $PYTHON (set PYTHON)"
    log "building the project image $PROJECT_IMAGE"
    work="$(mktemp -d "$OUT/project.XXXXXX")"
    rootfs="$work/rootfs"
    trap 'cleanup_mounts' EXIT

    # Wheels for the project and its operator extras, built by the host's pip: the image
    # build itself needs no network. Debian 12's python3 is 3.11, the same ABI as ours.
    log "building wheels with $PYTHON"
    "$PYTHON" -m pip wheel --wheel-dir "$work/wheels" "$REPO[operator]" >"$work/wheels.log" 2>&1 || {
        tail -30 "$work/wheels.log" >&2
        die "pip wheel failed (log above)"
    }

    cp -a "$BASE_ROOTFS" "$rootfs"
    mount -t proc proc "$rootfs/proc" && PROJECT_MOUNTS+=("$rootfs/proc")
    mount --bind /dev "$rootfs/dev" && PROJECT_MOUNTS+=("$rootfs/dev")
    mkdir -p "$rootfs/tmp/wheels"
    cp "$work/wheels"/*.whl "$rootfs/tmp/wheels/"

    # The Dockerfile's steps, in its order.
    chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
        PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 /bin/sh -eux -c '
        python3 -m venv /opt/venv
        /opt/venv/bin/pip install --no-index --find-links /tmp/wheels "sandbox-operator[operator]"
        rm -rf /tmp/wheels
        git config --system --add safe.directory "*"
        git config --system user.name "sandbox-operator"
        git config --system user.email "sandbox-operator@sandbox.cleveragents.io"
        groupadd --gid 65532 sandbox
        useradd --uid 65532 --gid 65532 --home-dir /home/sandbox --create-home --shell /usr/sbin/nologin sandbox
        mkdir -p /var/lib/sandbox-operator/state /var/lib/sandbox-operator/sandboxes /workspace
        chown -R 65532:65532 /var/lib/sandbox-operator /workspace
        ln -sf /usr/bin/python3 /usr/local/bin/python
    ' >"$work/chroot.log" 2>&1 || {
        tail -30 "$work/chroot.log" >&2
        die "installing the project into the image failed (log above)"
    }
    cleanup_mounts
    trap - EXIT

    tar_rootfs "$rootfs" "$work/layer.tar"
    umoci init --layout "$work/oci"
    umoci new --image "$work/oci:e2e"
    umoci raw add-layer --image "$work/oci:e2e" --history.created "$EPOCH" "$work/layer.tar"
    umoci config --image "$work/oci:e2e" --created "$EPOCH" --history.created "$EPOCH" \
        --architecture amd64 --os linux \
        --config.user 65532:65532 --config.workingdir /workspace \
        --config.env PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --config.env PYTHONUNBUFFERED=1 --config.env PYTHONDONTWRITEBYTECODE=1 \
        --config.env HOME=/home/sandbox \
        --config.exposedports 8080/tcp --config.exposedports 9090/tcp \
        --config.label org.opencontainers.image.title=sandbox-operator \
        --config.label org.opencontainers.image.version="$("$REPO/hack/version.sh")" \
        --config.entrypoint /usr/bin/tini --config.entrypoint -- \
        --config.cmd kopf --config.cmd run --config.cmd --standalone --config.cmd --all-namespaces \
        --config.cmd -m --config.cmd sandbox_operator.main \
        --config.cmd --liveness=http://0.0.0.0:8080/healthz
    tar_layout "$work/oci" "$tarball"
    rm -rf "$work"
    echo "$key" >"$stamp"
    log "project image built in $((SECONDS - start))s"
    echo "$PROJECT_IMAGE $tarball"
}

FORCE=0
TARGETS=()
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        pause | base | project | postgres) TARGETS+=("$arg") ;;
        all) TARGETS+=(pause project postgres) ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
            exit 0
            ;;
        *) die "unknown argument: $arg (try --help)" ;;
    esac
done
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(pause project)
[[ "$(id -u)" == 0 ]] || die "run as root (debootstrap and chroot need it)"
mkdir -p "$OUT"

for target in "${TARGETS[@]}"; do
    "build_$target"
done

#!/usr/bin/env bash
# Move every stored Sandbox, Checkpoint and PlanCommit to its CRD's storage version, then record
# that only that version is stored (the CRD's status.storedVersions), so that an older version
# can later stop being served (docs/api-evolution.md, "Storage migration").
#
# Usage: hack/migrate-storage.sh [--help]
#
# Run it once after the CRDs that store the new version are applied (helm upgrade). For each
# CRD it
#   1. reads the storage version from the CRD (spec.versions[storage=true]);
#   2. waits until the API server serves the CRD as applied (a request in every other served,
#      deprecated version gets its deprecation warning: the server built its handler from the
#      new CRD, so a write lands in the new storage version);
#   3. rewrites every object once, in every namespace: `kubectl get -o json | kubectl replace`
#      (an update that changes nothing; the API server encodes the object in the storage
#      version). An object changed or deleted between the read and the write was written in
#      the new version by that change, or is gone, and is skipped;
#   4. sets status.storedVersions to [<storage version>].
# Nothing is written when an object cannot be read; the script stops at the first error it does
# not understand, before step 4 of that CRD, and can be run again.
#
# The in-tree StorageVersionMigration API (storagemigration.k8s.io) does step 3 inside the
# cluster where it is served; in Kubernetes 1.35 it is beta and off by default (feature gate
# StorageVersionMigrator, a runtime-config and kube-controller-manager's migrator controller),
# so this script is the documented way. With several API servers, run it when every one of them
# has the new CRDs (step 2 asks only the one that answers).
#
# Environment:
#   KUBECTL             kubectl to run (default: kubectl); KUBECONFIG as kubectl reads it
#   SANDBOX_CRD_WAIT    seconds to wait in step 2 (default 60)
set -euo pipefail

GROUP=sandbox.cleveragents.io
PLURALS=(sandboxes checkpoints plancommits)
KUBECTL=${KUBECTL:-kubectl}
WAIT=${SANDBOX_CRD_WAIT:-60}

case "${1:-}" in
    "") ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 0
        ;;
    *)
        echo "migrate-storage: unknown argument: $1 (try --help)" >&2
        exit 2
        ;;
esac

log() { echo "migrate-storage: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# Wait until a request in each deprecated served version of CRD $1 gets its warning.
wait_served() {
    local crd=$1 plural=$2 version deadline warning
    deadline=$((SECONDS + WAIT))
    for version in $("$KUBECTL" get crd "$crd" \
        -o jsonpath='{range .spec.versions[?(@.deprecated==true)]}{.name}{" "}{end}'); do
        while true; do
            warning=$("$KUBECTL" get "$plural.$version.$GROUP" --all-namespaces \
                -o name 2>&1 >/dev/null </dev/null || true)
            [[ $warning == *deprecated* ]] && break
            ((SECONDS < deadline)) || die "$crd: $version is not answered as deprecated after ${WAIT}s"
            sleep 1
        done
    done
}

# Rewrite one object; 0 when written or skipped (changed or deleted meanwhile).
rewrite() {
    local resource=$1 namespace=$2 name=$3 body out
    if ! body=$("$KUBECTL" get "$resource" -n "$namespace" "$name" -o json 2>&1 </dev/null); then
        [[ $body == *NotFound* ]] && return 0
        die "$resource $namespace/$name: read failed: $body"
    fi
    if ! out=$("$KUBECTL" replace -f - <<<"$body" 2>&1); then
        # Changed since the read (written in the new version by that change) or deleted.
        [[ $out == *"has been modified"* || $out == *NotFound* ]] && return 0
        die "$resource $namespace/$name: write failed: $out"
    fi
}

for plural in "${PLURALS[@]}"; do
    crd="$plural.$GROUP"
    storage=$("$KUBECTL" get crd "$crd" -o jsonpath='{.spec.versions[?(@.storage==true)].name}')
    [[ -n $storage ]] || die "$crd: no storage version (is the CRD installed?)"
    wait_served "$crd" "$plural"
    resource="$plural.$storage.$GROUP"
    objects=$("$KUBECTL" get "$resource" --all-namespaces \
        -o jsonpath='{range .items[*]}{.metadata.namespace}{" "}{.metadata.name}{"\n"}{end}')
    count=0
    while read -r namespace name; do
        [[ -n $name ]] || continue
        rewrite "$resource" "$namespace" "$name"
        count=$((count + 1))
    done <<<"$objects"
    "$KUBECTL" patch crd "$crd" --subresource=status --type=merge \
        -p "{\"status\":{\"storedVersions\":[\"$storage\"]}}" >/dev/null
    log "$crd: $count object(s) rewritten in $storage; storedVersions [$storage]"
done

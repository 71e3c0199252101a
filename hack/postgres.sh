#!/usr/bin/env bash
# A real, throw-away PostgreSQL server for the transaction_rollback tests (DESIGN.md, test tier 1).
#
#   hack/postgres.sh start   # install if needed, init the cluster once, start it, print the DSN
#   hack/postgres.sh stop    # stop the server (the cluster directory is kept)
#   hack/postgres.sh dsn     # print the DSN (does not start anything)
#   hack/postgres.sh status  # exit 0 when the server is running
#
# Every command is idempotent and safe to run concurrently (an flock guards start/stop).
# The cluster lives outside the repository, listens only on 127.0.0.1 (and a unix socket in the
# cluster directory), and runs as a non-root user: PostgreSQL refuses to run as root.
#
# Settings (environment):
#   SANDBOX_PG_DIR   cluster directory            (default /tmp/sandbox-operator-pg)
#   SANDBOX_PG_PORT  TCP port on 127.0.0.1        (default 55432)
#   SANDBOX_PG_USER  OS user that runs the server (default postgres; created when missing)
#   SANDBOX_PG_DB    database the tests use       (default sandbox_test)
#   SANDBOX_PG_MAX_PREPARED  max_prepared_transactions (default 64; the two-phase plan commit
#                    PREPAREs one transaction per database sandbox; 0 makes plans fall back to
#                    the saga). A running server with another value is restarted.
#
# The server is tuned for tests (fsync off): never point it at data you want to keep.
set -euo pipefail

PG_DIR=${SANDBOX_PG_DIR:-/tmp/sandbox-operator-pg}
PG_PORT=${SANDBOX_PG_PORT:-55432}
PG_OS_USER=${SANDBOX_PG_USER:-postgres}
PG_DB=${SANDBOX_PG_DB:-sandbox_test}
PG_MAX_PREPARED=${SANDBOX_PG_MAX_PREPARED:-64}
# Test-only credentials of a cluster that only listens on the loopback interface.
PG_ROLE=sandbox
PG_PASSWORD=sandbox
DATA_DIR="$PG_DIR/data"
LOG_FILE="$PG_DIR/server.log"

dsn() {
  echo "postgresql://${PG_ROLE}:${PG_PASSWORD}@127.0.0.1:${PG_PORT}/${PG_DB}"
}

log() { echo "postgres.sh: $*" >&2; }

# Directory holding initdb/pg_ctl/postgres; installs Debian's postgresql when none is found.
find_bindir() {
  local candidate
  for candidate in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$candidate/initdb" ] && [ -x "$candidate/pg_ctl" ]; then
      echo "$candidate"
      return 0
    fi
  done
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v initdb)")"
    return 0
  fi
  return 1
}

ensure_binaries() {
  if ! BIN=$(find_bindir); then
    log "PostgreSQL binaries not found; installing Debian's postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
    BIN=$(find_bindir) || { log "initdb/pg_ctl still not found after install"; exit 1; }
  fi
}

# Run a command as the server's OS user (directly when we already are that user).
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u "$PG_OS_USER" -- "$@"
  else
    "$@"
  fi
}

ensure_os_user() {
  [ "$(id -u)" -eq 0 ] || { PG_OS_USER=$(id -un); return 0; }
  if ! id "$PG_OS_USER" >/dev/null 2>&1; then
    log "creating system user $PG_OS_USER"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_OS_USER"
  fi
}

is_running() {
  [ -f "$DATA_DIR/PG_VERSION" ] && as_pg "$BIN/pg_ctl" -D "$DATA_DIR" status >/dev/null 2>&1
}

psql_admin() {
  # Superuser over the unix socket in the cluster directory (trust for local socket only).
  as_pg psql -X -q -v ON_ERROR_STOP=1 -h "$PG_DIR" -p "$PG_PORT" -U "$PG_OS_USER" -d postgres "$@"
}

init_cluster() {
  [ -f "$DATA_DIR/PG_VERSION" ] && return 0
  log "initialising cluster in $DATA_DIR"
  mkdir -p "$PG_DIR"
  if [ "$(id -u)" -eq 0 ]; then chown "$PG_OS_USER" "$PG_DIR"; fi
  chmod 700 "$PG_DIR"
  rm -rf "$DATA_DIR"
  # Socket connections as the OS superuser are trusted; TCP needs the password (scram).
  as_pg "$BIN/initdb" -D "$DATA_DIR" -U "$PG_OS_USER" --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 \
    || { cat "$PG_DIR/initdb.log" >&2; exit 1; }
  cat >>"$DATA_DIR/postgresql.conf" <<CONF
# hack/postgres.sh: loopback only, fixed port, socket in the cluster directory, tuned for tests
listen_addresses = '127.0.0.1'
port = ${PG_PORT}
unix_socket_directories = '${PG_DIR}'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 100
CONF
}

start_server() {
  if is_running && [ "$(psql_admin -tAc 'SHOW max_prepared_transactions')" != "$PG_MAX_PREPARED" ]; then
    log "restarting server: max_prepared_transactions must be $PG_MAX_PREPARED"
    as_pg "$BIN/pg_ctl" -D "$DATA_DIR" -m fast -w stop >/dev/null
  fi
  if ! is_running; then
    log "starting server on 127.0.0.1:$PG_PORT"
    # 9>&-: the server must not inherit the lock descriptor, or it would hold the lock forever.
    as_pg "$BIN/pg_ctl" -D "$DATA_DIR" -l "$LOG_FILE" -w -t 60 \
      -o "-c max_prepared_transactions=$PG_MAX_PREPARED" start >/dev/null 9>&- \
      || { tail -n 30 "$LOG_FILE" >&2; exit 1; }
  fi
}

ensure_role_and_db() {
  if [ "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE'")" != "1" ]; then
    psql_admin -c "CREATE ROLE $PG_ROLE LOGIN PASSWORD '$PG_PASSWORD'"
  fi
  if [ "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != "1" ]; then
    psql_admin -c "CREATE DATABASE $PG_DB OWNER $PG_ROLE"
  fi
}

with_lock() {
  mkdir -p "$(dirname "$PG_DIR")"
  exec 9>"$PG_DIR.lock"
  flock -w 120 9 || { log "timed out waiting for $PG_DIR.lock"; exit 1; }
}

cmd=${1:-}
case "$cmd" in
  start)
    with_lock
    ensure_binaries
    ensure_os_user
    init_cluster
    start_server
    ensure_role_and_db
    dsn
    ;;
  stop)
    with_lock
    ensure_binaries
    ensure_os_user
    if is_running; then
      as_pg "$BIN/pg_ctl" -D "$DATA_DIR" -m fast -w stop >/dev/null
      log "stopped"
    fi
    ;;
  status)
    ensure_binaries
    ensure_os_user
    is_running
    ;;
  dsn)
    dsn
    ;;
  *)
    echo "usage: $0 start|stop|status|dsn" >&2
    exit 2
    ;;
esac

# Source me: exports the environment the tests and the demo use (after hack/setup.sh).
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_root/.venv/bin:$PATH"
if [ -x "$_root/hack/postgres.sh" ]; then
  SANDBOX_TEST_POSTGRES_DSN="$("$_root/hack/postgres.sh" dsn)"
  export SANDBOX_TEST_POSTGRES_DSN
fi
if [ -x "$_root/hack/build-k8s-binaries.sh" ]; then
  SANDBOX_K8S_BIN="$("$_root/hack/build-k8s-binaries.sh" 2>/dev/null | tail -n 1)"
  export SANDBOX_K8S_BIN
  export PATH="$SANDBOX_K8S_BIN:$PATH"
fi
unset _root

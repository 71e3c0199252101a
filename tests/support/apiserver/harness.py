"""A real etcd + kube-apiserver on 127.0.0.1 for tests: what controller-runtime's envtest does.

`LocalApiServer` generates its own PKI with `cryptography`, starts etcd and kube-apiserver on free
loopback ports in a temporary directory, waits for `/readyz`, writes an admin kubeconfig and, on
exit, stops both processes and removes the directory. No controller-manager, scheduler or kubelet
runs: objects are stored and validated (schemas, CEL rules, admission, RBAC) but nothing
reconciles them, so pods stay Pending and namespaces are never finalized.

Binaries come from ``SANDBOX_K8S_BIN`` or from ``hack/build-k8s-binaries.sh`` (tier 2 in
shared/DESIGN.md, "Test tiers"; docs/k8s-binaries.md).

Typical use::

    with LocalApiServer() as server:
        server.kubectl("get", "namespaces", check=True)
        kopf_env = server.env()  # KUBECONFIG + PATH for a subprocess
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-k8s-binaries.sh"
BIN_ENV_VAR = "SANDBOX_K8S_BIN"
KEEP_DIR_ENV_VAR = "SANDBOX_APISERVER_KEEP_DIR"

REQUIRED_BINARIES = ("etcd", "kube-apiserver", "kubectl")
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
# The first address of the service range: the in-cluster "kubernetes" Service.
KUBERNETES_SERVICE_IP = "10.0.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "sandbox-test-admin"
LOG_TAIL_LINES = 40


class ApiServerHarnessError(RuntimeError):
    """Base class of the errors raised by this harness."""


class BinariesNotFoundError(ApiServerHarnessError):
    """The etcd / kube-apiserver / kubectl binaries could not be found or built."""


class StartupError(ApiServerHarnessError):
    """etcd or kube-apiserver did not become ready; the message ends with the tail of its log."""


def find_bin_dir(*, build: bool = True) -> Path:
    """Return the directory holding etcd, kube-apiserver and kubectl.

    Order: the ``SANDBOX_K8S_BIN`` environment variable, else the last stdout line of
    ``hack/build-k8s-binaries.sh`` (which builds on a cold cache - many minutes - and answers
    in well under a second on a warm one). With ``build=False`` the script is not run.

    Raises:
        BinariesNotFoundError: the variable names a directory without the binaries, the script
            failed (its stderr tail is in the message), or ``build`` is false and the variable
            is unset.
    """
    from_env = os.environ.get(BIN_ENV_VAR)
    if from_env:
        bin_dir = Path(from_env).expanduser().resolve()
        origin = f"${BIN_ENV_VAR}={from_env}"
    elif build:
        try:
            result = subprocess.run(
                ["bash", str(BUILD_SCRIPT)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise BinariesNotFoundError(f"cannot run {BUILD_SCRIPT}: {exc}") from exc
        if result.returncode != 0:
            raise BinariesNotFoundError(
                f"{BUILD_SCRIPT} exited with {result.returncode}:\n{_tail(result.stderr)}"
            )
        lines = result.stdout.strip().splitlines()
        if not lines:
            raise BinariesNotFoundError(f"{BUILD_SCRIPT} printed no bin directory")
        bin_dir = Path(lines[-1])
        origin = str(BUILD_SCRIPT)
    else:
        raise BinariesNotFoundError(f"${BIN_ENV_VAR} is not set and building was not allowed")
    missing = [name for name in REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise BinariesNotFoundError(
            f"{bin_dir} (from {origin}) lacks executable {', '.join(missing)}; "
            f"run {BUILD_SCRIPT.relative_to(REPO_ROOT)}"
        )
    return bin_dir


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _file_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return _tail(path.read_text(errors="replace"), lines)
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


# --- PKI ---------------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _Pki:
    """A throw-away CA plus the serving, client and service-account keys one server needs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        now = datetime.datetime.now(datetime.UTC)
        self._not_before = now - datetime.timedelta(minutes=5)
        self._not_after = now + datetime.timedelta(days=2)

        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-test-ca")])
        self._ca_name = ca_name
        self.ca_cert = (
            self._builder(ca_name, self._ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()),
                critical=False,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca_cert_path = self._write("ca.crt", _pem_cert(self.ca_cert))

        serving_key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.DNSName("kubernetes"),
            x509.DNSName("kubernetes.default"),
            x509.DNSName("kubernetes.default.svc"),
            x509.DNSName("kubernetes.default.svc.cluster.local"),
            x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
            x509.IPAddress(ipaddress.IPv4Address(KUBERNETES_SERVICE_IP)),
        ]
        serving = self._leaf("kube-apiserver", None, serving_key, ExtendedKeyUsageOID.SERVER_AUTH)
        serving = serving.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        self.serving_cert_path = self._write(
            "apiserver.crt", _pem_cert(serving.sign(self._ca_key, hashes.SHA256()))
        )
        self.serving_key_path = self._write("apiserver.key", _pem_key(serving_key))

        admin_key = ec.generate_private_key(ec.SECP256R1())
        admin = self._leaf(
            ADMIN_USER, "system:masters", admin_key, ExtendedKeyUsageOID.CLIENT_AUTH
        ).sign(self._ca_key, hashes.SHA256())
        self.admin_cert_pem = _pem_cert(admin)
        self.admin_key_pem = _pem_key(admin_key)
        self.admin_cert_path = self._write("admin.crt", self.admin_cert_pem)
        self.admin_key_path = self._write("admin.key", self.admin_key_pem)

        # RSA for service-account tokens: RS256 is what every token consumer understands.
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key_path = self._write("sa.key", _pem_key(sa_key))
        self.sa_pub_path = self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_after)
        )

    def _leaf(
        self,
        common_name: str,
        organization: str | None,
        key: ec.EllipticCurvePrivateKey,
        usage: x509.ObjectIdentifier,
    ) -> x509.CertificateBuilder:
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        return (
            self._builder(x509.Name(attributes), key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()),
                critical=False,
            )
        )

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return path


# --- processes -----------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGKILL the child when the thread that started it dies (PR_SET_PDEATHSIG).

    A crashed or SIGKILLed pytest then leaves no etcd or kube-apiserver behind.
    """
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class _Process:
    """One child process with its output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log: IO[bytes] = log_path.open("ab")
        # PR_SET_PDEATHSIG follows the starting *thread*: only use it from the main thread,
        # where the thread's death is the process's death.
        in_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if in_main_thread else None,
            )
        except OSError:
            self._log.close()
            raise

    def running(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_seconds: float) -> None:
        """SIGTERM, wait up to ``grace_seconds``, then SIGKILL; always reaps and closes the log."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGTERM)
                try:
                    self.popen.wait(timeout=grace_seconds)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(timeout=30)
        finally:
            self._log.close()

    def failure(self, what: str) -> StartupError:
        self._log.flush()
        state = (
            "is still running" if self.running() else f"exited with code {self.popen.returncode}"
        )
        return StartupError(
            f"{self.name} {what}; it {state}. Last lines of {self.log_path}:\n"
            f"{_file_tail(self.log_path)}"
        )


class LocalApiServer:
    """etcd + kube-apiserver on 127.0.0.1 with an admin kubeconfig, as a context manager.

    Attributes available after `start` (or entering the ``with`` block):
        bin_dir: directory of etcd, kube-apiserver, kubectl (also `kubectl_path`).
        work_dir: the temporary directory holding certificates, etcd data, logs, kubeconfig.
        server_url: ``https://127.0.0.1:<port>``.
        kubeconfig_path: admin kubeconfig (user in group ``system:masters``, certificates
            embedded, so the file can be copied elsewhere).
        ca_cert_path, admin_cert_path, admin_key_path: PEM files for other HTTPS clients.
        etcd_url: ``http://127.0.0.1:<port>`` (plain HTTP, loopback only).
        etcd_log_path, apiserver_log_path: the processes' combined stdout/stderr.

    Args:
        bin_dir: where the binaries are; default `find_bin_dir()` (env var or build script).
        start_timeout_seconds: how long etcd and then kube-apiserver each get to become ready.
        stop_grace_seconds: how long each process gets after SIGTERM before SIGKILL.
        extra_apiserver_args: appended to the kube-apiserver command line (later flags win).
        keep_work_dir: keep `work_dir` after stopping (also with ``SANDBOX_APISERVER_KEEP_DIR=1``),
            for debugging; its path is in the logs of the test run.
        temp_root: where the work dir is created (default: the system temp dir).

    Raises (from `start` / ``__enter__``):
        BinariesNotFoundError: the binaries are missing and could not be built.
        StartupError: a process exited or did not get ready in time; the message has its log
            tail. Everything started so far has been stopped and cleaned up by then.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        start_timeout_seconds: float = 90.0,
        stop_grace_seconds: float = 15.0,
        extra_apiserver_args: Sequence[str] = (),
        keep_work_dir: bool | None = None,
        temp_root: Path | None = None,
    ) -> None:
        self._requested_bin_dir = bin_dir
        self.temp_root = temp_root
        self.start_timeout_seconds = start_timeout_seconds
        self.stop_grace_seconds = stop_grace_seconds
        self.extra_apiserver_args = list(extra_apiserver_args)
        if keep_work_dir is None:
            keep_work_dir = os.environ.get(KEEP_DIR_ENV_VAR, "") not in ("", "0", "false")
        self.keep_work_dir = keep_work_dir
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._work_dir: Path | None = None
        self._bin_dir: Path | None = None
        self._server_url: str | None = None
        self._etcd_url: str | None = None
        self._pki: _Pki | None = None
        self._kubeconfig_path: Path | None = None
        self.startup_seconds: float | None = None
        """Seconds from `start` to a ready kube-apiserver (after the binaries were found)."""

    # -- properties ------------------------------------------------------------------------

    def _need(self, value: object, name: str) -> object:
        if value is None:
            raise ApiServerHarnessError(f"{name} is only known while the server is running")
        return value

    @property
    def bin_dir(self) -> Path:
        """Directory holding etcd, kube-apiserver and kubectl."""
        return Path(str(self._need(self._bin_dir, "bin_dir")))

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def work_dir(self) -> Path:
        return Path(str(self._need(self._work_dir, "work_dir")))

    @property
    def server_url(self) -> str:
        """``https://127.0.0.1:<secure port>``."""
        return str(self._need(self._server_url, "server_url"))

    @property
    def etcd_url(self) -> str:
        return str(self._need(self._etcd_url, "etcd_url"))

    @property
    def kubeconfig_path(self) -> Path:
        """Path of the admin kubeconfig (context ``sandbox-test``, namespace ``default``)."""
        return Path(str(self._need(self._kubeconfig_path, "kubeconfig_path")))

    def _pki_or_raise(self) -> _Pki:
        pki = self._pki
        if pki is None:
            raise ApiServerHarnessError("the certificates exist only while the server is running")
        return pki

    @property
    def ca_cert_path(self) -> Path:
        return self._pki_or_raise().ca_cert_path

    @property
    def admin_cert_path(self) -> Path:
        return self._pki_or_raise().admin_cert_path

    @property
    def admin_key_path(self) -> Path:
        return self._pki_or_raise().admin_key_path

    @property
    def etcd_log_path(self) -> Path:
        return self.work_dir / "etcd.log"

    @property
    def apiserver_log_path(self) -> Path:
        return self.work_dir / "kube-apiserver.log"

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True while both processes are alive."""
        return (
            self._etcd is not None
            and self._etcd.running()
            and self._apiserver is not None
            and self._apiserver.running()
        )

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running children: ``{"etcd": ..., "kube-apiserver": ...}``."""
        return {
            process.name: process.popen.pid
            for process in (self._etcd, self._apiserver)
            if process is not None and process.running()
        }

    def start(self) -> None:
        """Start etcd, then kube-apiserver, wait for ``/readyz`` and write the kubeconfig.

        Raises:
            ApiServerHarnessError: already started.
            BinariesNotFoundError, StartupError: see the class docstring. On any error the
                processes started so far are stopped and the work dir is removed (unless kept).
        """
        if self._work_dir is not None:
            raise ApiServerHarnessError("this LocalApiServer is already started")
        self._bin_dir = self._requested_bin_dir or find_bin_dir()
        began = time.monotonic()
        self._work_dir = Path(tempfile.mkdtemp(prefix="sandbox-apiserver-", dir=self.temp_root))
        try:
            pki_dir = self._work_dir / "pki"
            pki_dir.mkdir(mode=0o700)
            self._pki = _Pki(pki_dir)
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd; remove the work dir. Safe to call more than once."""
        try:
            for attr in ("_apiserver", "_etcd"):
                process: _Process | None = getattr(self, attr)
                if process is not None:
                    process.stop(self.stop_grace_seconds)
                    setattr(self, attr, None)
        finally:
            work_dir, self._work_dir = self._work_dir, None
            if work_dir is not None and not self.keep_work_dir:
                shutil.rmtree(work_dir, ignore_errors=True)
            self._server_url = self._etcd_url = None
            self._kubeconfig_path = None
            self._pki = None

    def _start_with_port_retry(self, start: Callable[[], None], attempts: int = 3) -> None:
        """Call ``start()``; retry when the child lost a race for its free port."""
        for attempt in range(1, attempts + 1):
            try:
                start()
            except StartupError as exc:
                if attempt < attempts and "address already in use" in str(exc):
                    continue
                raise
            return

    def _start_etcd(self) -> None:
        def attempt() -> None:
            client_port, peer_port = free_port(), free_port()
            client_url = f"http://127.0.0.1:{client_port}"
            peer_url = f"http://127.0.0.1:{peer_port}"
            data_dir = self.work_dir / "etcd-data"
            shutil.rmtree(data_dir, ignore_errors=True)
            argv = [
                str(self.bin_dir / "etcd"),
                "--name=sandbox-test",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=sandbox-test={peer_url}",
                "--initial-cluster-state=new",
                # Test data: durability across power loss is not worth the fsync latency.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ]
            self._etcd = process = _Process("etcd", argv, self.etcd_log_path)
            self._etcd_url = client_url
            self._wait_until(process, self._etcd_healthy)

        self._start_with_port_retry(attempt)

    def _etcd_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:  # noqa: S310
                body = json.loads(response.read())
        except (OSError, ValueError):
            return False
        return isinstance(body, dict) and body.get("health") == "true"

    def _start_apiserver(self) -> None:
        pki = self._pki_or_raise()

        def attempt() -> None:
            port = free_port()
            cert_dir = self.work_dir / "apiserver-certs"
            cert_dir.mkdir(exist_ok=True)
            argv = [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={cert_dir}",
                f"--tls-cert-file={pki.serving_cert_path}",
                f"--tls-private-key-file={pki.serving_key_path}",
                f"--client-ca-file={pki.ca_cert_path}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub_path}",
                f"--service-account-signing-key-file={pki.sa_key_path}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--authorization-mode=RBAC",
                # No controller-manager runs, so nothing would create the token secrets and
                # service accounts this admission plugin insists on.
                "--disable-admission-plugins=ServiceAccount",
                "--allow-privileged=true",
                # Only the one API server writes the kubernetes Service endpoints; a loopback
                # address there is rejected anyway.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                # MutatingAdmissionPolicy (beta and off by default in 1.35): the chart's policy
                # that sets the operator's metadata at admission is tested here. Without a
                # policy object installed, the API server behaves as without the gate.
                "--feature-gates=MutatingAdmissionPolicy=true",
                "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
                *self.extra_apiserver_args,
            ]
            self._apiserver = process = _Process("kube-apiserver", argv, self.apiserver_log_path)
            self._server_url = f"https://127.0.0.1:{port}"
            self._wait_until(process, self._apiserver_ready)

        self._start_with_port_retry(attempt)

    def _ssl_context(self) -> ssl.SSLContext:
        pki = self._pki_or_raise()
        context = ssl.create_default_context(cafile=str(pki.ca_cert_path))
        context.load_cert_chain(str(pki.admin_cert_path), str(pki.admin_key_path))
        return context

    def get(self, path: str, *, timeout: float = 10.0) -> tuple[int, str]:
        """GET ``path`` (e.g. ``/readyz?verbose``) as the admin user over verified TLS.

        Returns:
            ``(HTTP status, body text)``; HTTP error statuses are returned, not raised.

        Raises:
            ApiServerHarnessError: not started.
            OSError: connection-level failures (refused, TLS, timeout).
        """
        request = urllib.request.Request(f"{self.server_url}{path}", method="GET")  # noqa: S310
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=timeout, context=self._ssl_context()
            ) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode(errors="replace")

    def _apiserver_ready(self) -> bool:
        try:
            status, body = self.get("/readyz", timeout=2)
        except OSError:
            return False
        return status == 200 and body.strip() == "ok"

    def _wait_until(self, process: _Process, ready: Callable[[], bool]) -> None:
        """Poll ``ready()`` until true; on exit or time-out stop ``process`` and raise."""
        deadline = time.monotonic() + self.start_timeout_seconds
        delay = 0.05
        while True:
            if not process.running():
                error = process.failure("exited before it became ready")
            elif ready():
                return
            elif time.monotonic() > deadline:
                error = process.failure(f"was not ready within {self.start_timeout_seconds:g}s")
            else:
                time.sleep(delay)
                delay = min(delay * 1.5, 0.5)
                continue
            process.stop(self.stop_grace_seconds)
            raise error

    def _write_kubeconfig(self) -> None:
        pki = self._pki_or_raise()

        def b64(data: bytes) -> str:
            return base64.b64encode(data).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sandbox-test",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": b64(_pem_cert(pki.ca_cert)),
                    },
                }
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": {
                        "client-certificate-data": b64(pki.admin_cert_pem),
                        "client-key-data": b64(pki.admin_key_pem),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "sandbox-test",
                    "context": {
                        "cluster": "sandbox-test",
                        "user": ADMIN_USER,
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "sandbox-test",
            "preferences": {},
        }
        path = self.work_dir / "kubeconfig"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(config, handle, indent=2)  # JSON is YAML: every kubeconfig reader takes it
        self._kubeconfig_path = path

    # -- helpers for tests -----------------------------------------------------------------

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a subprocess talking to this server.

        Returns a copy of ``base`` (default `os.environ`) with ``KUBECONFIG`` set to
        `kubeconfig_path` and `bin_dir` first on ``PATH``.
        """
        env = dict(os.environ if base is None else base)
        env["KUBECONFIG"] = str(self.kubeconfig_path)
        env["PATH"] = os.pathsep.join(filter(None, [str(self.bin_dir), env.get("PATH", "")]))
        return env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,  # mirrors subprocess.run
        check: bool = False,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl with the admin kubeconfig: ``kubectl --kubeconfig=... *args``.

        Returns:
            The completed process; ``stdout`` and ``stderr`` are text.

        Raises:
            ApiServerHarnessError: not started.
            subprocess.CalledProcessError: ``check`` is true and kubectl exited non-zero
                (its ``stderr`` attribute carries kubectl's message).
            subprocess.TimeoutExpired: kubectl ran longer than ``timeout`` seconds.
        """
        return subprocess.run(
            [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig_path}", *args],
            input=input,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def kubectl_json(self, *args: str, timeout: float = 60.0) -> object:
        """Run ``kubectl *args -o json`` and return the parsed output.

        Raises:
            subprocess.CalledProcessError: kubectl failed.
        """
        result = self.kubectl(*args, "-o", "json", check=True, timeout=timeout)
        return json.loads(result.stdout)

"""Run the whole stack in the foreground: `make run` (and the tests, and bench/).

Starts the session, runner and sandbox services and the gateway as child
processes, waits until each answers its health check, prints where things
are, and stops all of them on Ctrl-C or SIGTERM. Every BAE_* variable is
passed through, so several stacks can run side by side on other ports.

The children run in the caller's working directory, and `bae run` makes every
path setting absolute against it before they start: an installed `bae run`
keeps its files where it was started, never in site-packages.

Exit codes: 0 stopped on Ctrl-C/SIGTERM, 1 a service failed (a port already in
use among them), 2 usage error (a setting).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bae.common.entry import version_text
from bae.common.errors import UsageError
from bae.common.secret_files import secret_setting
from bae.common.internal import TOKEN_METADATA
from bae.common.settings import Address, Settings, admin_key_dir, load_settings

ROOT = Path(__file__).resolve().parents[2]
# Run from a checkout (`make run`, the tests): the children must import the same `bae` as this process,
# whatever directory they start in and whichever `bae` their interpreter has installed.
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "bae" / "__init__.py").is_file()
# The demo provider's registry name and model (bae/services/runner/demo.py).
DEMO_PROVIDER = "demo"
DEMO_MODEL = "bae-demo-echo"


# Settings that name a file; every other BAE_*_FILE variable (a secret's file) is one too.
PATH_SETTINGS = ("BAE_DB_PATH", "BAE_CONFIG")


def is_path_setting(name: str) -> bool:
    return name in PATH_SETTINGS or (name.startswith("BAE_") and name.endswith("_FILE"))


def absolute_paths(env: dict[str, str], cwd: Path) -> dict[str, str]:
    """`env` with each relative path setting made absolute against `cwd` (the caller's directory)."""
    return {
        name: os.path.normpath(cwd / value) if is_path_setting(name) and value and not os.path.isabs(value) else value
        for name, value in env.items()
    }


def local_defaults(env: dict[str, str], data_dir: Path) -> dict[str, str]:
    """Defaults for a developer machine: the store under ./data instead of /var/lib/bae, and the admin key
    files beside the store (SQLite), so another store never finds, or replaces, this one's key; with
    PostgreSQL they stay in ./data."""
    defaults = {"BAE_DB_PATH": str(data_dir / "bae.db")}
    key_dir = Path(admin_key_dir({**defaults, **env}) or data_dir)
    defaults["BAE_ADMIN_KEY_FILE"] = str(key_dir / "admin-key.pem")
    defaults["BAE_ADMIN_KEY_HASH_FILE"] = str(key_dir / "admin-key-hash.pem")
    return defaults


def child_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child: from a checkout, with the checkout first on its import path."""
    if not CHECKOUT:
        return env
    paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def grpc_serving(address: str, service: str = "") -> bool:
    """One health probe: does `address` report `service` ("" = the whole server) SERVING?"""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


# A method no service has: a server that takes the internal token answers UNIMPLEMENTED, one of another stack
# (another token) UNAUTHENTICATED. So a health answer is known to come from this stack's service.
IDENTITY_METHOD = "/baeproto.v1.Launcher/Identify"


def grpc_holds_token(address: str, token: str) -> bool:
    """Whether the gRPC server at `address` accepts the internal `token` (is one of this stack's services)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(IDENTITY_METHOD, request_serializer=bytes, response_deserializer=bytes)
        try:
            call(b"", timeout=1, metadata=[(TOKEN_METADATA, token)])
        except grpc.RpcError as exc:
            return bool(exc.code() == grpc.StatusCode.UNIMPLEMENTED)
    return False


def _listening_inodes(port: int) -> set[int] | None:
    """Socket inodes listening on TCP `port` (Linux's /proc/net); None where the system does not tell."""
    found: set[int] = set()
    read = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # tcp6 is absent where IPv6 is off
        try:
            with open(table) as lines:
                rows = [line.split() for line in lines.readlines()[1:]]
        except OSError:
            continue
        read += 1
        # local_address is HEX_IP:HEX_PORT; state 0A is LISTEN; the inode is the tenth column.
        found |= {int(row[9]) for row in rows
                  if len(row) > 9 and row[3] == "0A" and int(row[1].rpartition(":")[2], 16) == port}
    return found if read else None


def listens(pid: int, address: Address) -> bool | None:
    """Whether process `pid` holds a socket listening on `address`'s port; None where the system does not tell."""
    inodes = _listening_inodes(address.port)
    if inodes is None:
        return None
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return None
    held = {int(link[8:-1]) for link in links if link.startswith("socket:[")}
    return bool(inodes & held)


@dataclass
class Stack:
    env: dict[str, str]
    session_args: list[str] = field(default_factory=list)
    log_dir: Path | None = None
    # The children's working directory; None: this process's.
    cwd: Path | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The services it starts share a fresh internal token unless one is given (bae.common.internal),
        # in the environment or as a file (bae.common.secret_files).
        if not (secret_setting(self.env, "BAE_INTERNAL_TOKEN") or "").strip():
            self.env["BAE_INTERNAL_TOKEN"] = secrets.token_hex(32)

    @property
    def settings(self) -> Settings:
        return load_settings(self.env)

    def _grpc_services(self, settings: Settings) -> dict[str, tuple[list[str], str]]:
        """The restartable gRPC services: name -> (interpreter arguments, address to health-check)."""
        services = {"runner": (["-m", "bae", "runner"], settings.runner_grpc_addr)}
        for name, address in session_replicas(settings).items():
            services[name] = (["-m", "bae", "session", "serve", *self.session_args], address)
        return services

    def _extra_env(self, name: str, settings: Settings) -> dict[str, str]:
        if name.startswith("session"):
            return {"BAE_SESSION_GRPC_ADDR": self._grpc_services(settings)[name][1]}
        return {}

    def start(self, timeout: float = 30.0) -> None:
        settings = self.settings
        services = self._grpc_services(settings)
        replicas = session_replicas(settings)
        if len(replicas) > 1 and "BAE_SESSION_GRPC_ADDRS" not in self.env:
            self.env["BAE_SESSION_GRPC_ADDRS"] = ",".join(replicas.values())
        deadline = time.monotonic() + timeout
        # The first replica migrates the store and writes the admin key before the others start.
        self._spawn("session", services["session"][0], self._extra_env("session", settings))
        self._wait_grpc("session", services["session"][1], deadline)
        for name, (args, _) in services.items():
            if name != "session":
                self._spawn(name, args, self._extra_env(name, settings))
        for index, address in enumerate(settings.sandbox_grpc_addrs):
            self._spawn(
                f"sandbox-{index}" if index else "sandbox",
                ["-m", "bae", "sandbox"],
                {
                    "BAE_SANDBOX_LISTEN_ADDR": address,
                    # Each host removes its own labelled containers at start: ids must differ.
                    **({"BAE_SANDBOX_HOST_ID": f"{self.env['BAE_SANDBOX_HOST_ID']}-{index}"}
                       if "BAE_SANDBOX_HOST_ID" in self.env and index else {}),
                },
            )
        for name, (_, address) in services.items():
            self._wait_grpc(name, address, deadline)
        self._spawn("gateway", ["-m", "bae", "gateway"])
        host = "127.0.0.1" if settings.addr.host in ("0.0.0.0", "::") else settings.addr.host
        self.client_url = f"http://{host}:{settings.addr.port}"
        self.admin_url = f"http://{settings.admin_addr}"
        self._wait_http("gateway", f"{self.client_url}/healthz", deadline, (settings.addr, settings.admin_addr))

    def _spawn(self, name: str, args: list[str], extra: dict[str, str] | None = None) -> None:
        env = child_env({**self.env, **(extra or {})})
        log: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = open(self.log_dir / f"{name}.log", "ab")
        # The child holds its own copy of the log's descriptor; the parent's closes at once.
        with log as output:
            self.processes[name] = subprocess.Popen(
                [sys.executable, *args], cwd=self.cwd, env=env, stdout=output, stderr=output
            )

    def _check_alive(self, name: str) -> None:
        code = self.processes[name].poll()
        if code is not None:
            raise RuntimeError(f"{name} exited with code {code} during start-up")

    def _wait(self, name: str, ready: Callable[[], bool], what: str, deadline: float) -> None:
        """Poll `ready()` until it is true; fail fast if the process died, also after an answer (which then
        came from another process)."""
        while True:
            self._check_alive(name)
            if ready():
                self._check_alive(name)
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become healthy at {what}")
            time.sleep(0.05)

    def _wait_grpc(self, name: str, address: str, deadline: float) -> None:
        token = self.settings.internal_token or ""
        self._wait(name, lambda: grpc_serving(address) and grpc_holds_token(address, token), address, deadline)

    def _wait_http(self, name: str, url: str, deadline: float, addresses: tuple[Address, ...] = ()) -> None:
        """Until `url` answers 200 and, where this system tells, `name` itself listens on `addresses`."""
        pid = self.processes[name].pid

        def answering() -> bool:
            try:
                if httpx.get(url, timeout=1).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
            return all(listens(pid, address) is not False for address in addresses)

        self._wait(name, answering, url, deadline)

    def stop(self, timeout: float = 35.0) -> dict[str, int]:
        """SIGTERM the gateway and the session service, then the rest; kill what outlives `timeout`.

        The session service stops its sessions' sandboxes on the way out, so
        the sandbox hosts must still be up while it does.
        """
        deadline = time.monotonic() + timeout
        codes: dict[str, int] = {}
        first = [name for name in self.processes if name == "gateway" or name.startswith("session")]
        rest = [name for name in self.processes if name not in first]
        for group in (first, rest):
            for name in group:
                if self.processes[name].poll() is None:
                    self.processes[name].send_signal(signal.SIGTERM)
            for name in group:
                process = self.processes[name]
                try:
                    codes[name] = process.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    process.kill()
                    codes[name] = process.wait()
        self.processes.clear()
        return codes

    def restart(self, name: str, timeout: float = 30.0, *, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop one gRPC service (`sig`, then kill) and start it again; the others keep running.

        `sig=signal.SIGKILL` simulates a crash: the service gets no chance to clean up.
        """
        process = self.processes[name]
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        args, address = self._grpc_services(self.settings)[name]
        self._spawn(name, args, self._extra_env(name, self.settings))
        self._wait_grpc(name, address, time.monotonic() + timeout)

    def supervise(self) -> tuple[str, int]:
        """Block until a child exits for good; returns its name and exit code.

        With several session replicas, one that dies is started again while the others
        serve (its sessions move to them meanwhile) unless it keeps dying at start-up.
        """
        settings = self.settings
        replicated = settings.session_replicas > 1
        quick_exits: dict[str, int] = {}
        started = {name: time.monotonic() for name in self.processes}
        while True:
            for name, process in list(self.processes.items()):
                code = process.poll()
                if code is None:
                    continue
                if not (replicated and name.startswith("session")):
                    return name, code
                # A replica that keeps dying within 10 s of its start (four times running) is a crash loop.
                died_young = time.monotonic() - started[name] < 10
                quick_exits[name] = quick_exits.get(name, 0) + 1 if died_young else 1
                if quick_exits[name] > 3:
                    return name, code
                print(f"{name} exited with code {code}; starting it again", file=sys.stderr, flush=True)
                self._spawn(name, self._grpc_services(settings)[name][0], self._extra_env(name, settings))
                started[name] = time.monotonic()
            time.sleep(0.2)


def session_replicas(settings: Settings) -> dict[str, str]:
    """name -> gRPC address of each session replica: consecutive ports from BAE_SESSION_GRPC_ADDR's."""
    host, _, port = settings.session_grpc_addr.rpartition(":")
    return {
        f"session-{index}" if index else "session": f"{host}:{int(port) + index}"
        for index in range(settings.session_replicas)
    }


def require_shared_store(settings: Settings) -> None:
    if settings.session_replicas > 1 and not (settings.database_url or "").startswith("postgres"):
        raise UsageError(
            f"BAE_SESSION_REPLICAS={settings.session_replicas} needs a store the replicas share: "
            "set BAE_DATABASE_URL=postgresql://user@host:port/db (SQLite serves one replica only)"
        )


DEMO_PROVIDER_ADDR = "127.0.0.1:8089"


def demo_config(address: str) -> str:
    """The demo provider's bae-config.toml entry (`--demo`): the runner's scripted echo model."""
    return (
        "# The built-in DEMO provider (`make demo`): a scripted echo model served by the runner\n"
        "# on BAE_DEMO_PROVIDER_ADDR. Not a real model; never enabled unless asked for.\n"
        "[[providers.entries]]\n"
        f'name = "{DEMO_PROVIDER}"\nprovider = "anthropic"\nmodel = "{DEMO_MODEL}"\n'
        f'base_url = "http://{address}"\nauth_token = "demo-needs-no-key"\n'
    )


def demo_env(env: dict[str, str], data_dir: Path) -> dict[str, str]:
    """`env` with the demo provider enabled, and a config that is the user's own (BAE_CONFIG, when
    set) with the demo provider added to its providers, or names the demo provider alone."""
    address = env.get("BAE_DEMO_PROVIDER_ADDR") or DEMO_PROVIDER_ADDR
    text = demo_config(address)
    if env.get("BAE_CONFIG"):
        text = with_user_config(Path(env["BAE_CONFIG"]), text)
    config = Path(env.get("BAE_DB_PATH") or data_dir / "bae.db").parent / "demo-config.toml"
    # A copy of the user's config may hold literal secrets (an auth_token): readable by its owner only,
    # and never written through a link planted at its path.
    descriptor = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    return {**env, "BAE_DEMO_PROVIDER_ADDR": address, "BAE_CONFIG": str(config)}


def with_user_config(path: Path, demo: str) -> str:
    """The user's config file followed by the demo provider's entry (`demo`): its MCP servers,
    telemetry, limits and everything else apply to the demo stack as they would to a real one."""
    try:
        user = path.read_text(encoding="utf-8")
        existing = tomllib.loads(user)
    except OSError as exc:
        raise UsageError(f"cannot read BAE_CONFIG={path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f'cannot read config file "{path}": stream did not contain valid UTF-8') from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f'invalid config file "{path}": {exc}') from None
    entries = existing.get("providers", {}).get("entries", []) if isinstance(existing.get("providers"), dict) else []
    if any(isinstance(entry, dict) and entry.get("name") == DEMO_PROVIDER for entry in entries):
        raise UsageError(f'BAE_CONFIG={path} has a provider named "{DEMO_PROVIDER}", the name --demo gives its own: '
                         "rename that entry")
    combined = f"# {path.resolve()}, then the demo provider (`bae run --demo`)\n{user}\n\n{demo}"
    try:
        tomllib.loads(combined)
    except tomllib.TOMLDecodeError:
        # Only an inline `providers.entries = [...]` array refuses a table appended after it.
        raise UsageError(f"--demo adds its provider to BAE_CONFIG={path} as a [[providers.entries]] table: "
                         "write that file's providers as [[providers.entries]] tables too") from None
    return combined


def is_loopback_target(target: str) -> bool:
    """Whether a gRPC `host:port` target names this machine only (a hostname counts as not)."""
    host = target.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback(settings: Settings) -> None:
    """`bae run` starts every service on this machine: their gRPC ports stay on loopback."""
    exposed = [
        target
        for target in (*session_replicas(settings).values(), settings.runner_grpc_addr, *settings.sandbox_grpc_addrs)
        if not is_loopback_target(target)
    ]
    if exposed:
        raise UsageError(
            f"internal gRPC addresses must be loopback under `bae run` (got {', '.join(exposed)}); "
            "deploy the services separately (docker-compose.yml) to reach them from elsewhere"
        )


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """`bae run` options; everything else goes to the session service (`bae session serve --help`)."""
    parser = argparse.ArgumentParser(
        prog="bae run",
        description="Start the session, runner and sandbox services and the gateway in the foreground "
        "(state under ./data of the current directory unless BAE_* variables say otherwise; relative paths in "
        "them resolve against it). Other options are passed to "
        "`bae session serve`, e.g. --rotate-admin-key.",
    )
    parser.add_argument("-V", "--version", action="version", version=version_text())
    parser.add_argument("--demo", action="store_true",
                        help=f'add the built-in demo provider "{DEMO_PROVIDER}" (a scripted echo model; no API key)')
    return parser.parse_known_args(argv)


def stack_env(environ: dict[str, str], cwd: Path, demo: bool) -> dict[str, str]:
    """The stack's environment: `environ`'s paths made absolute against `cwd`, the local defaults under
    `cwd`/data, the demo provider's settings with `demo` (whose config is written beside the store)."""
    data_dir = cwd / "data"
    env = absolute_paths(environ, cwd)
    env = {**local_defaults(env, data_dir), **env}
    if demo:
        Path(env["BAE_DB_PATH"]).parent.mkdir(parents=True, exist_ok=True)
        env = demo_env(env, data_dir)
    return env


def listeners(settings: Settings) -> list[tuple[str, str]]:
    """(address, the variable that sets it) of every port the stack listens on."""
    replicas = list(session_replicas(settings).values())
    named = [(str(settings.addr), "BAE_ADDR"), (str(settings.admin_addr), "BAE_ADMIN_ADDR"),
             *((address, "BAE_SESSION_GRPC_ADDR" if index == 0 else
                f"BAE_SESSION_GRPC_ADDR (+{index} for session replica {index + 1} of BAE_SESSION_REPLICAS)")
               for index, address in enumerate(replicas)),
             (settings.runner_grpc_addr, "BAE_RUNNER_GRPC_ADDR"),
             *((address, "BAE_SANDBOX_GRPC_ADDRS") for address in settings.sandbox_grpc_addrs)]
    if settings.demo_provider_addr is not None:
        named.append((str(settings.demo_provider_addr), "BAE_DEMO_PROVIDER_ADDR"))
    return named


def bind_problem(address: str) -> str | None:
    """Why `address` (host:port) cannot be listened on now, or None. Binds and closes at once, as a server
    would (SO_REUSEADDR: a port in TIME_WAIT is free), so a port another process listens on is refused even
    when that process shares ports (SO_REUSEPORT, as gRPC servers do)."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError) as exc:
        return f"cannot resolve {address}: {exc}"
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"{address} is already in use"
                return f"cannot listen on {address}: {exc.strerror or exc}"
    return None


def port_problem(settings: Settings) -> str | None:
    """The first listen address of the stack that is taken (or named twice), as the line `bae run` prints."""
    seen: dict[str, str] = {}
    for address, variable in listeners(settings):
        if address in seen:
            return f"{address} is set twice, by {seen[address]} and {variable}; give each its own port"
        seen[address] = variable
        problem = bind_problem(address)
        if problem is not None:
            return f"{problem} ({variable}); stop what listens there or set {variable.split()[0]} to a free address"
    return None


def main(argv: list[str]) -> int:
    options, session_args = parse_args(argv)
    try:
        env = stack_env(dict(os.environ), Path.cwd(), options.demo)
        settings = load_settings(env)
        require_loopback(settings)
        require_shared_store(settings)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Before anything starts: a taken port is one line naming it, never a half-started stack.
    problem = port_problem(settings)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if settings.database_url is None:
        try:
            Path(settings.db_path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(f"error: cannot create the store's directory: {exc}", file=sys.stderr)
            return 1
    stack = Stack(env=env, session_args=session_args)

    def request_stop(signum: int, frame: object) -> None:
        # One stop at a time: the same request often comes twice (`make run` forwards its SIGTERM to
        # this process, which its process group got already), and a second one must not break off the
        # stop under way, leaving the services it had not stopped yet running. The stop is bounded:
        # what outlives its deadline is killed.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        stack.start()
        demo_line = (f"  DEMO provider: \"{DEMO_PROVIDER}\" (scripted echo model) on {settings.demo_provider_addr};"
                     " try: .venv/bin/python examples/first_session.py\n" if options.demo else "")
        print(
            f"\nBAE is running.\n"
            f"  client API : {stack.client_url}\n"
            f"  admin API  : {stack.admin_url}  (loopback only)\n"
            f"  admin key  : {settings.admin_key_file}\n"
            f"  store      : {settings.printable_database_url}\n"
            f"  sessions   : {', '.join(session_replicas(settings).values())}\n"
            f"{demo_line}"
            f"Press Ctrl-C to stop.\n",
            flush=True,
        )
        name, code = stack.supervise()
        print(f"{name} exited with code {code}; stopping the stack", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop(timeout=settings.shutdown_timeout + 5)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`baectl setup`: the quickstart wizard (BAECTL.md §7). Local; it talks to the server only to launch it.

The compose launcher runs this project's four service images with whichever Compose is installed:
`docker compose` (v2) or `docker-compose` (v1, 1.27 and later).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from bae.ctl.api import CtlError
from bae.ctl.commands import COPY_KEY_NOW
from bae.ctl.files import read_file, write_file
from bae.ctl.setup_files import (
    COMPOSE, CONFIG, ENV, INTERNAL_TOKEN, SCRIPT, SECRET_OVERRIDE, TEMPLATE, McpServer, Provider, Setup, compose_text, config_text,
    env_text, read_existing, script_text,
)

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROVIDER_DEFAULTS = {"anthropic": ("sonnet-5", "ANTHROPIC_API_KEY"), "openai": ("gpt-5.6-luna", "OPENAI_API_KEY")}
MCP_CHOICES = ("filesystem", "fetch", "github", "custom")
GITHUB_URL = "https://api.githubcopilot.com/mcp/"
# Question order, with the documented defaults: only answers that differ are written to .env.
SETTING_DEFAULTS = {"BAE_ADDR": "0.0.0.0:8080", "BAE_LOG": "info", "BAE_SHUTDOWN_TIMEOUT": "30",
                "BAE_TURN_TIMEOUT": "120", "BAE_SANDBOX_DRIVER": "docker"}
Check = Callable[[str], str | None]  # the validation message, or None when the answer is fine


def err(message: str) -> None:
    print(message, file=sys.stderr)


class Prompter:
    """Prompts on stdout, answers from stdin; without a TTY (or at EOF) every answer is its default."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive

    def _read(self, prompt: str) -> str | None:
        if not self.interactive:
            return None
        print(prompt, end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            self.interactive = False  # EOF: this and every later question takes its default
            print()
            return None
        return line.strip()

    def text(self, question: str, default: str, check: Check | None = None) -> str:
        while True:
            answer = self._read(f"{question} [{default}]: ")
            value = answer if answer else default
            problem = check(value) if check else None
            if problem is None:
                return value
            err(f"  {problem}")
            if answer is None:
                raise CtlError(problem)  # a default that cannot pass; nobody to ask again

    def yes(self, question: str, default: bool) -> bool:
        while True:
            answer = self._read(f"{question} [{'Y/n' if default else 'y/N'}]: ")
            if not answer:
                return default
            if answer.lower() in ("y", "yes", "n", "no"):
                return answer.lower().startswith("y")
            err("  please answer y or n")


def one_of(choices: tuple[str, ...], message: str) -> Check:
    return lambda value: None if value in choices else message.format(value)


def non_empty(what: str, taken: set[str] | None = None, kind: str = "") -> Check:
    def check(value: str) -> str | None:
        if not value:
            return f"{what} cannot be empty"
        if taken is not None and value in taken:
            return f'{kind} name "{value}" already used; choose another'
        return None
    return check


def listen_address(value: str) -> str | None:
    host, sep, port = value.rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
        valid = bool(sep) and port.isdigit() and int(port) <= 65535
    except ValueError:
        valid = False
    return None if valid else f'"{value}" is not a valid <ip>:<port> listen address (e.g. 0.0.0.0:8080)'


def seconds(value: str) -> str | None:
    return None if value.isdigit() else f'"{value}" is not a whole number of seconds'


def port_number(value: str) -> str | None:
    return None if value.isdigit() and 1 <= int(value) <= 65535 else f'"{value}" is not a valid port number'


class Wizard:
    def __init__(self, ask: Prompter, previous: Setup | None, apple: bool = False) -> None:
        self.ask = ask
        self.apple = apple
        self.previous = previous  # when editing: the saved answers, used as defaults only
        self.result = Setup()
        self.unresolved: list[str] = []

    def secret(self, var: str) -> None:
        """Rules of BAECTL.md §7.3, first match wins."""
        if var in self.result.secrets:
            return
        if os.environ.get(var):
            self.result.secrets[var] = os.environ[var]
            return
        saved = self.previous.secrets.get(var) if self.previous else None
        if saved and self.ask.yes(f"  Keep the existing value for {var}?", True):
            self.result.secrets[var] = saved
            return
        value = self.ask.text(f"  Value for {var}? (blank to skip)", "")
        if value:
            self.result.secrets[var] = value
            if var in self.unresolved:
                self.unresolved.remove(var)
        elif var not in self.unresolved:
            self.unresolved.append(var)

    def run(self) -> Setup:
        old = self.previous or Setup()
        # The `max` variant is a single-container image of Apple's CLI only; compose runs the four services.
        if self.apple:
            self.result.variant = self.ask.text(
                "Image variant? (standard/max)", old.variant,
                one_of(("standard", "max"), 'unknown variant "{}"; choose standard or max'))
        self.providers(old)
        self.mcp_servers(old)
        self.settings(old)
        return self.result

    def providers(self, old: Setup) -> None:
        if self.ask.interactive:
            print("At least one provider is required (a profile needs a primary provider).")
        taken: set[str] = set()
        while True:
            index = len(self.result.providers)
            before = old.providers[index] if index < len(old.providers) else None
            kind = self.ask.text("  Provider kind? (anthropic/openai)", before.kind if before else "anthropic",
                                 one_of(tuple(PROVIDER_DEFAULTS), 'unknown provider kind "{}"'))
            same = before if before and before.kind == kind else None
            model, token_var = PROVIDER_DEFAULTS[kind]
            name = self.ask.text("  Registry name?", same.name if same else f"{kind}-default",
                                 non_empty("name", taken, "provider"))
            taken.add(name)
            model = self.ask.text("  Model?", same.model if same else model, non_empty("model"))
            token_var = self.ask.text(
                "  Auth token env var name?", same.token_var if same else token_var,
                lambda v: None if ENV_NAME.fullmatch(v) else f'"{v}" is not a valid environment variable name '
                "(letters, digits, and underscores; not starting with a digit)")
            self.secret(token_var)
            self.result.providers.append(Provider(kind, name, model, token_var))
            if not self.ask.yes("Add another provider?", len(old.providers) > index + 1):
                return

    def mcp_servers(self, old: Setup) -> None:
        taken: set[str] = set()
        while self.ask.yes("Add an MCP server?", len(old.mcp) > len(self.result.mcp)):
            before = old.mcp[len(self.result.mcp)] if len(old.mcp) > len(self.result.mcp) else None
            default = before.name if before and before.name in MCP_CHOICES else "custom" if before else "filesystem"
            choice = self.ask.text("  Which? (filesystem/fetch/github/custom)", default,
                                   one_of(MCP_CHOICES, 'unknown choice "{}"'))
            name = self.ask.text("  Server name?", before.name if before else choice,
                                 non_empty("name", taken, "MCP server"))
            taken.add(name)
            self.result.mcp.append(self.mcp_server(choice, name, before))

    def mcp_server(self, choice: str, name: str, before: McpServer | None) -> McpServer:
        if choice == "filesystem":
            previous = before.args[-1] if before and before.args else "/data"
            directory = self.ask.text("  Directory to expose?", previous)
            return McpServer(name, "stdio", "npx", ["-y", "@modelcontextprotocol/server-filesystem", directory])
        if choice == "fetch":
            return McpServer(name, "stdio", "uvx", ["mcp-server-fetch"])
        if choice == "github":
            self.secret("GITHUB_TOKEN")
            return McpServer(name, "http", url=GITHUB_URL, headers={"Authorization": "Bearer ${GITHUB_TOKEN}"})
        transport = self.ask.text("  Transport? (stdio/http/sse)", before.transport if before else "stdio",
                                  one_of(("stdio", "http", "sse"), 'unknown transport "{}"'))
        if transport == "stdio":
            command = self.ask.text("  Command?", (before.command if before else None) or "npx",
                                    non_empty("command"))
            args = self.ask.text("  Args? (space-separated)", " ".join(before.args) if before else "").split()
            return McpServer(name, transport, command, args)
        url = self.ask.text("  URL?", (before.url if before else None) or "", non_empty("URL"))
        headers: dict[str, str] = {}
        saved = list(before.headers.items()) if before else []  # editing: each saved header is a default
        while self.ask.yes("  Add a header?", len(saved) > len(headers)):
            key, value = saved[len(headers)] if len(saved) > len(headers) else ("Authorization", "")
            key = self.ask.text("  Header name?", key)
            headers[key] = self.header_value(name, key, self.ask.text("  Header value?", value))
        return McpServer(name, transport, url=url, headers=headers)

    def header_value(self, server: str, header: str, value: str) -> str:
        """A header's value as bae-config.toml (0644) holds it: a `${VAR}` reference, its value in .env
        (0600). A value that refers to variables already keeps them, each asked for as a secret."""
        names = TEMPLATE.findall(value)
        for var in names:
            self.secret(var)
        if names or not value:
            return value
        base = "MCP_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{server}_{header}").strip("_").upper()
        var, number = base, 1
        while var in self.result.secrets:
            number += 1
            var = f"{base}_{number}"
        self.result.secrets[var] = value
        return "${" + var + "}"

    def settings(self, old: Setup) -> None:
        checks: dict[str, Check | None] = {"BAE_ADDR": listen_address, "BAE_LOG": None,
                                           "BAE_SHUTDOWN_TIMEOUT": seconds, "BAE_TURN_TIMEOUT": seconds,
                                           "BAE_SANDBOX_DRIVER": one_of(
                                               ("docker", "apple-container"),
                                               '"{}" is not a supported sandbox driver (choose docker or apple-container)')}
        for var, default in SETTING_DEFAULTS.items():
            value = self.ask.text(f"{var}?", old.overrides.get(var, default), checks[var])
            if checks[var] is seconds:
                value = str(int(value))
            if value != default:
                self.result.overrides[var] = value
        if self.result.variant != "max":
            return
        self.result.max_port = int(self.ask.text("MAX web port?", str(old.max_port), port_number))
        saved = old.secrets.get(SECRET_OVERRIDE)
        if saved and self.ask.yes(f"Keep the existing value for {SECRET_OVERRIDE}?", True):
            self.result.secrets[SECRET_OVERRIDE] = saved
            return
        password = self.ask.text("MAX password? (blank = MAX generates one on first boot)", "")
        if password:
            self.result.secrets[SECRET_OVERRIDE] = password


def check_directory(directory: Path) -> None:
    if not directory.exists():
        raise CtlError(f"--dir {directory} does not exist")
    if not directory.is_dir():
        raise CtlError(f"--dir {directory} is not a directory")
    probe = directory / ".baectl-setup-write-probe"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CtlError(f"--dir {directory} is not writable: {exc.strerror or exc}") from None


def write_setup(directory: Path, setup: Setup, apple: bool, dev: bool) -> None:
    flags = " ".join(flag for flag, on in (("--dev", dev), ("--apple", apple)) if on) or "(none)"
    launcher = (SCRIPT, script_text(setup, flags, dev), 0o755) if apple else \
        (COMPOSE, compose_text(setup, flags, dev), 0o644)
    for name, content, mode in ((CONFIG, config_text(setup, flags), 0o644), (ENV, env_text(setup, flags), 0o600),
                                launcher):
        try:
            write_file(str(directory / name), content, mode)
        except OSError as exc:
            raise CtlError(f"could not write {directory / name}: {exc.strerror or exc}") from None
    stale = directory / (COMPOSE if apple else SCRIPT)
    if stale.exists():
        try:
            stale.unlink()
        except OSError as exc:
            raise CtlError(f"could not remove stale {stale}: {exc.strerror or exc}") from None


def on_path(program: str) -> bool:
    return any(os.path.isfile(path := os.path.join(folder, program)) and os.access(path, os.X_OK)
               for folder in os.environ.get("PATH", "").split(os.pathsep) if folder)


INSTALL_COMPOSE = ("install Docker Compose: the `docker compose` plugin (the docker-compose-plugin package, "
                   "https://docs.docker.com/compose/install/) or docker-compose 1.27 or later "
                   "(the docker-compose package)")


def compose_command() -> list[str] | None:
    """The Compose installed here: `docker compose` (v2) when docker has the plugin, else `docker-compose`
    (v1); None when neither is."""
    if on_path("docker"):
        try:
            plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            plugin = False
        if plugin:
            return ["docker", "compose"]
    return ["docker-compose"] if on_path("docker-compose") else None


def in_container(setup: Setup, directory: Path, apple: bool, *args: str) -> dict[str, Any]:
    compose = [] if apple else compose_command()
    if compose is None:
        raise CtlError(f"no Docker Compose found on PATH — {INSTALL_COMPOSE}")
    prefix = ["container", "exec", setup.container] if apple else [*compose, "exec", "-T", setup.service]
    try:
        done = subprocess.run([*prefix, "baectl", *args], cwd=directory, capture_output=True, text=True)
    except OSError as exc:
        raise CtlError(f"failed to exec baectl in the container: {exc}") from None
    if done.returncode != 0:
        raise CtlError(f"in-container `baectl {' '.join(args)}` failed: {done.stderr.strip()}")
    command = " ".join(args[:2])
    try:
        parsed = json.loads(done.stdout)
    except ValueError as exc:
        raise CtlError(f"could not parse `{command}` output: {exc}") from None
    if not isinstance(parsed, dict):
        raise CtlError(f"could not parse `{command}` output: not a JSON object")
    return parsed


def launch(directory: Path, setup: Setup, apple: bool, fresh: bool) -> None:
    # The container CLI (BAECTL.md calls it the engine; its messages below are the spec's).
    if apple:
        if not on_path("container"):
            raise CtlError("container not found on PATH — install it (or generate here and deploy elsewhere) "
                           "then re-run `baectl setup` and choose Launch.")
        command = [str(directory / SCRIPT)]
    else:
        compose = compose_command()
        if compose is None:
            raise CtlError(f"no Docker Compose found on PATH (neither `docker compose` nor `docker-compose`) — "
                           f"{INSTALL_COMPOSE} (or generate here and deploy elsewhere), then re-run `baectl setup` "
                           "and choose Launch.")
        command = [*compose, "up", "-d"]
    try:
        code = subprocess.run(command, cwd=directory).returncode
    except OSError as exc:
        raise CtlError(f"failed to launch: {exc}") from None
    if code != 0:
        raise CtlError("the container engine exited non-zero while launching (see its output above)")
    health = f"http://127.0.0.1:{setup.port}/healthz"
    for _ in range(30):
        try:
            if httpx.get(health, timeout=2).is_success:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    else:
        raise CtlError(f"server did not become healthy at {health} within the timeout; check the container logs")
    if not fresh:
        print("Re-launched the saved configuration. (The prior profile/key are assumed to still exist — if they "
              "were deleted, re-run and choose Edit to recreate them.)")
        return
    profile = in_container(setup, directory, apple, "create", "profile", "default", setup.providers[0].name, "--json")
    if not isinstance(profile.get("id"), str):
        raise CtlError("`create profile` output had no id")
    print(f"created profile 'default' ({profile['id']})")
    key = in_container(setup, directory, apple, "create", "key", "default", profile["id"], "--json")
    if not isinstance(key.get("key"), str):
        raise CtlError("`create key` output had no key")
    print("created client key 'default':")
    print(f"  {key['key']}")
    err(COPY_KEY_NOW)
    print("Point a client at it with:")
    print(f"  export BAE_URL=http://localhost:{setup.port}")
    print(f"  export BAE_API_KEY={key['key']}")
    if apple and setup.variant == "max" and SECRET_OVERRIDE not in setup.secrets:
        print("MAX generated its own dashboard password on first boot. Retrieve it with:")
        print("  container exec bae-max cat /var/lib/bae/max-password.pem")


def setup(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    check_directory(directory)
    ask = Prompter(sys.stdin.isatty())
    apple = args.apple or ask.yes("Use Apple's `container` CLI (bae-setup.sh) instead of docker-compose?", False)
    dev = args.dev or ask.yes("Use locally built (`make images`) image tags instead of published ones?", False)
    launcher, other = (SCRIPT, COMPOSE) if apple else (COMPOSE, SCRIPT)
    present = [name for name in (launcher, ENV, CONFIG) if (directory / name).exists()]
    reason = None
    if (directory / other).exists():
        reason = f"found {other} but this run uses {launcher} (launcher/flag mismatch)"
    elif present and len(present) < 3:
        missing = [name for name in (launcher, ENV, CONFIG) if name not in present]
        reason = f"incomplete setup — missing {', '.join(missing)}"
    previous = None
    if reason is not None:
        err(f"baectl: {reason}.")
        err(f"        This looks like a corrupted or incomplete setup. Continuing will overwrite whatever partial "
            f"state is present in {directory}.")
        if not ask.yes("Overwrite and run a fresh setup?", False):
            err("baectl: aborted; no files were changed.")
            return 0
    elif present:
        saved = read_existing(directory, launcher)
        print("Found an existing setup:")
        print(f"  image variant: {saved.variant}")
        print(f"  providers:     {', '.join(p.name for p in saved.providers) or '(none)'}")
        print(f"  MCP servers:   {', '.join(s.name for s in saved.mcp) or '(none)'}")
        if not ask.yes("Edit this configuration? (No = launch the saved config as-is)", False):
            return finish(ask, directory, saved, apple, fresh=False, unresolved=[])
        for name in (launcher, ENV, CONFIG):
            try:  # the backups of .env and of an older config hold secrets: for the owner only
                write_file(str(directory / f"{name}.bak"), read_file(str(directory / name)), 0o600)
            except OSError as exc:
                raise CtlError(f"could not back up {name}: {exc.strerror or exc}") from None
        previous = saved
    wizard = Wizard(ask, previous, apple)
    answers = wizard.run()
    if not apple:
        # Every internal call carries it; kept across edits, so the services keep agreeing on it.
        kept = previous.secrets.get(INTERNAL_TOKEN) if previous else None
        answers.secrets[INTERNAL_TOKEN] = kept or secrets.token_hex(32)
    write_setup(directory, answers, apple, dev)
    return finish(ask, directory, answers, apple, fresh=True, unresolved=wizard.unresolved)


def finish(ask: Prompter, directory: Path, setup: Setup, apple: bool, fresh: bool, unresolved: list[str]) -> int:
    if unresolved:
        err(f"baectl: warning — no value was supplied for: {', '.join(unresolved)}")
        err("        the ${VAR} references are still in bae-config.toml but missing from .env, and the server "
            'will fail with an "unresolved ${ENV_VAR}" error until they are set.')
    if not ask.yes("Launch now?", ask.interactive):
        here = directory.resolve() == Path.cwd().resolve()
        go = "" if here else f"cd {shlex.quote(str(directory))} && "
        if apple:
            print("To launch the configuration:")
            print(f"  {go}./bae-setup.sh")
        else:
            compose = compose_command()
            if compose is None:
                print(f"To launch the configuration, {INSTALL_COMPOSE}, then run:")
                compose = ["docker", "compose"]
            else:
                print("To launch the configuration:")
            print(f"  {go}{' '.join(compose)} up -d")
        print("Re-running `baectl setup` in this directory offers the launch step again without redoing the Q&A.")
        return 0
    launch(directory, setup, apple, fresh)
    return 0

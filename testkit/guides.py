"""The guides in docs/guides/ as programs: what a guide's fenced blocks ask for, and the runner that does it.

A guide is read in document order:

- ```python: run; every python block of a guide runs in one interpreter, in one namespace
  (a fresh `__main__` module), so later blocks use what earlier ones defined;
- ```sh (or bash, shell): run with `bash -euo pipefail` in the same working directory and with
  that interpreter's `os.environ`, so a python block can set a variable for the sh blocks after it;
- `file=NAME` in the info string (```toml file=bae-config.toml): written to NAME, relative to the
  working directory, before anything runs;
- `no-run` in the info string: shown to the reader only (`bae run`, a real provider's key);
- any other language (text, json, http, yaml, ...): output shown to the reader, never run.

An HTML comment `<!-- guide: needs=docker,postgres stack=none -->` says what a guide needs:
`needs=` what must be present (docker, postgres), `stack=none` that it starts its own processes
(otherwise the test starts `bae run --demo` for it: tests/integration/test_guides.py).

The runner is `python -m testkit.guides GUIDE.md`, started by the test in the guide's working
directory. It imports nothing but the standard library, so the guide's program sees only what
it imports itself. A python block's traceback names the guide's file and line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

PYTHON = {"python", "py", "python3"}
SHELL = {"sh", "bash", "shell"}
# Directives a guide may give, and the values each accepts.
NEEDS = {"docker", "postgres"}
STACKS = {"demo", "none"}
# Generous bounds: a guide is a page a person reads, not a data set.
MAX_GUIDE_BYTES = 1024 * 1024
MAX_BLOCKS = 500

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"<!--\s*guide:(?P<body>.*?)-->", re.DOTALL)


class GuideError(ValueError):
    """A guide that cannot be run as written (an unclosed fence, an unknown directive, a bad file name)."""


@dataclass(frozen=True)
class Block:
    language: str  # the info string's first word, lower-cased ("" when none)
    code: str
    line: int  # the guide's line of the block's first code line (1-based)
    no_run: bool = False
    file: str | None = None  # file=NAME

    @property
    def kind(self) -> str:
        """"file", "python", "sh", or "shown" (never run)."""
        if self.no_run:
            return "shown"
        if self.file is not None:
            return "file"
        if self.language in PYTHON:
            return "python"
        if self.language in SHELL:
            return "sh"
        return "shown"


@dataclass(frozen=True)
class Guide:
    path: Path
    blocks: list[Block]
    needs: frozenset[str] = frozenset()
    stack: str = "demo"
    files: dict[str, str] = field(default_factory=dict)

    @property
    def steps(self) -> list[Block]:
        """The blocks that run, in document order."""
        return [block for block in self.blocks if block.kind in ("python", "sh")]


def _parse_info(info: str, line: int) -> tuple[str, bool, str | None]:
    words = info.split()
    language = words[0].lower() if words else ""
    no_run, file = False, None
    for word in words[1:]:
        if word == "no-run":
            no_run = True
        elif word.startswith("file="):
            file = _safe_name(word[len("file="):], line)
    if language == "no-run":  # ```no-run alone
        language, no_run = "", True
    return language, no_run, file


def _safe_name(name: str, line: int) -> str:
    """A file= name: relative, inside the working directory."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or ".." in path.parts:
        raise GuideError(f"line {line}: file={name!r} must be a relative path inside the guide's directory")
    return str(path)


def _parse_directives(text: str) -> tuple[frozenset[str], str]:
    needs: set[str] = set()
    stack = "demo"
    for match in _DIRECTIVE.finditer(text):
        for word in match.group("body").split():
            key, _, value = word.partition("=")
            if key == "needs":
                wanted = {item for item in value.split(",") if item}
                if not wanted or wanted - NEEDS:
                    raise GuideError(f"guide directive {word!r}: needs= takes {', '.join(sorted(NEEDS))}")
                needs |= wanted
            elif key == "stack":
                if value not in STACKS:
                    raise GuideError(f"guide directive {word!r}: stack= takes {', '.join(sorted(STACKS))}")
                stack = value
            else:
                raise GuideError(f"unknown guide directive {word!r} (needs=..., stack=...)")
    return frozenset(needs), stack


def parse(text: str, path: Path | str = "<guide>") -> Guide:
    """The guide in `text`: its fenced blocks in order (CommonMark fences: ``` or ~~~, up to three
    spaces of indent, closed by a fence of the same character at least as long), and its directives."""
    if len(text.encode()) > MAX_GUIDE_BYTES:
        raise GuideError(f"{path}: over {MAX_GUIDE_BYTES} bytes")
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        index += 1
        if opening is None:
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        if fence[0] == "`" and "`" in opening.group("info"):
            continue  # not a fence: an inline code span at the start of a line
        start = index
        language, no_run, file = _parse_info(opening.group("info"), start + 1)
        body: list[str] = []
        while True:
            if index >= len(lines):
                raise GuideError(f"{path}:{start}: the block opened here is never closed")
            closing = _FENCE.match(lines[index])
            index += 1
            if closing and closing.group("fence")[0] == fence[0] and len(closing.group("fence")) >= len(fence) \
                    and not closing.group("info").strip():
                break
            line = lines[index - 1]
            # The opening fence's indent is removed from each line (CommonMark), no more.
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
        blocks.append(Block(language, "\n".join(body) + ("\n" if body else ""), start + 1, no_run, file))
        if len(blocks) > MAX_BLOCKS:
            raise GuideError(f"{path}: over {MAX_BLOCKS} blocks")
    needs, stack = _parse_directives(text)
    files: dict[str, str] = {}
    for block in blocks:
        if block.kind == "file":
            assert block.file is not None
            if block.file in files:
                raise GuideError(f"{path}:{block.line}: file={block.file} is written twice")
            files[block.file] = block.code
    return Guide(Path(path), blocks, needs, stack, files)


def read(path: Path) -> Guide:
    return parse(path.read_text(encoding="utf-8"), path)


def write_files(guide: Guide, directory: Path) -> None:
    for name, content in guide.files.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")


def _banner(guide: Guide, block: Block, number: int) -> None:
    print(f"\n----- {guide.path.name}:{block.line} ({block.kind} block {number}) -----", flush=True)


def run(guide: Guide) -> int:
    """Run the guide's steps here, in this process's working directory; 0 when every step succeeded."""
    write_files(guide, Path.cwd())
    # The guide's program is a script: its own __main__, not this module's.
    # (This module stays referenced by `runner` while the guide's module takes its place.)
    runner = sys.modules.get("__main__")
    main = types.ModuleType("__main__")
    main.__file__ = str(guide.path)
    sys.modules["__main__"] = main
    for number, block in enumerate(guide.steps, 1):
        _banner(guide, block, number)
        if block.kind == "python":
            # Padded so that a traceback's line numbers are the guide's own (linecache reads the file).
            code = compile("\n" * (block.line - 1) + block.code, str(guide.path), "exec")
            try:
                exec(code, main.__dict__)
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    print(f"FAILED: {guide.path.name}:{block.line}: the python block exited with {exc.code}",
                          flush=True)
                    return 1
            except BaseException:
                traceback.print_exc(file=sys.stdout)
                print(f"FAILED: {guide.path.name}:{block.line}: the python block raised", flush=True)
                return 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
        else:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], env=dict(os.environ),
                                  stderr=subprocess.STDOUT)
            if done.returncode != 0:
                print(f"FAILED: {guide.path.name}:{block.line}: the sh block exited with {done.returncode}",
                      flush=True)
                return 1
    print(f"\n----- {guide.path.name}: {len(guide.steps)} blocks ran -----", flush=True)
    del runner
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m testkit.guides GUIDE.md  (runs it in the current directory)", file=sys.stderr)
        return 2
    # stderr joins stdout, so that the test shows one story in order.
    os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
    return run(read(Path(argv[0]).resolve()))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

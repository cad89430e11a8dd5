"""Every repository path the docs name exists: docstrings, comments and doc pages.

What is read: the docstrings and comments of every tracked .py file under gclm/, server/,
compiler/, masking/, bench/, tests/ and docker/; the whole text of docs/**/*.md, README.md,
Dockerfile, Makefile, pyproject.toml, mkdocs.yml and docker/'s other files. bench/results/
is a record of runs, not read (a path in it may name the code of its day).

What counts as a path, and what it must name:

- rooted: a token starting with a top-level folder, `compiler/grown/lazy_dfa.py`,
  `server/openai/`, `bench/results/*.json`, not preceded by a word character, `.`, `/`,
  `-`, `$` or `~` (so neither a URL's tail nor `$OUT/x`). It stops at `:` and backticks, so
  `tests/conftest.py::pytest_configure` and `masking/state.py:12` are checked as the file.
  It must be a tracked file or folder; a glob must match one; a module and a name in it,
  `compiler/grown/state_walk.walk_trie`, need the module and the name in its text.
  `__pycache__` paths are build output, not checked.
- partial: a token with a slash that ends in a file name (`.py`, `.md`, `.json`, `.sh`,
  `.toml`, `.yml`, `.yaml`) and does not start with a top-level folder, `chat/render.py`:
  the tail of a tracked path. Prose such as `and/or` or `tok/s` has no extension and is not
  a path; `build/` is ignored output. In a page, a link-like `../bench/results/x.md` is
  resolved from the page's folder instead.
- bare: a file name such as `graceful.py`, with no slash: some tracked file has that name.
- module: a dotted `gclm.*` or `bench.*` name, `gclm.compiler.front.constraint.Constraint`:
  its folders and module exist, and a first name after the module occurs in its text (a
  part in capitals, `bench.NAME`, is a placeholder and ends the check).
- owner: in "`path`'s `name`", "path's ByteDfa" or "path's read_byte_index" (a name that
  reads as code) and `path::name`, the name occurs in the file.
"""

from __future__ import annotations

import bisect
import fnmatch
import posixpath
import re
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("bench", "compiler", "docker", "docs", "gclm", "masking", "server", "tests")
PY_FOLDERS = ("gclm", "server", "compiler", "masking", "bench", "tests", "docker")
WHOLE_FILES = ("README.md", "Dockerfile", "Makefile", "pyproject.toml", "mkdocs.yml")
# The installed package's subpackages and the folders that hold them (pyproject.toml).
MODULE_FOLDERS = {"server": "server", "compiler": "compiler", "masking": "masking"}

_BEFORE = r"(?<![\w./$~-])"
ROOTED = re.compile(_BEFORE + "(?:" + "|".join(TOP) + r")/[\w.*-]*(?:/[\w.*-]+)*")
PARTIAL = re.compile(_BEFORE + r"[\w-][\w.-]*(?:/[\w.-]+)+\.(?:py|md|json|sh|toml|ya?ml)(?![\w/-])")
RELATIVE = re.compile(r"(?<![\w./$~-])\.\.?/[\w.*/-]+")
BARE = re.compile(_BEFORE + r"[\w-]+\.py(?![\w/-])")
MODULE = re.compile(r"(?<![\w./-])(?:gclm|bench)(?:\.\w+)+")
# `path`'s `name`, or unquoted a name that reads as code (CamelCase, snake_case): not prose.
OWNER = re.compile(
    r"`?([\w./-]+\.py)`?'s (?:`(\w+)`|([A-Z][a-z0-9]+[A-Z]\w*|[a-z]\w*_\w*)\b)"
    r"|([\w./-]+\.py)::(\w+)"
)


@dataclass(frozen=True)
class Repository:
    """A checkout's tracked files (paths from `root`), and the folders that hold them."""

    root: Path
    files: frozenset[str]

    @cached_property
    def folders(self) -> frozenset[str]:
        return frozenset(
            str(parent) for f in self.files for parent in PurePosixPath(f).parents if parent.parts
        )

    @cached_property
    def names(self) -> frozenset[str]:
        return frozenset(posixpath.basename(f) for f in self.files)

    def has(self, path: str) -> bool:
        path = path.rstrip("/")
        return path in self.files or path in self.folders

    def text(self, path: str) -> str:
        return (self.root / path).read_text(encoding="utf-8")

    def defines(self, path: str, name: str) -> bool:
        """Whether `name` occurs as a word in the file (a loose check, on purpose)."""
        return re.search(rf"\b{re.escape(name)}\b", self.text(path)) is not None


def _tracked() -> Repository:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return Repository(ROOT, frozenset(f for f in out.split("\0") if f))


def _scanned(repo: Repository) -> list[str]:
    def read(path: str) -> bool:
        top = path.split("/", 1)[0]
        if path.startswith("bench/results/"):
            return False
        if path.endswith(".py"):
            return top in PY_FOLDERS
        return path in WHOLE_FILES or (top == "docs" and path.endswith(".md")) or top == "docker"

    return sorted(f for f in repo.files if read(f))


# One pass over a .py file's text: its strings, comments and brackets, in order. A string at
# bracket depth 0 that begins its line is a statement of its own: a docstring (or a bare
# string, which reads as one). ast and tokenize find the same lines, 10x slower.
_PY = re.compile(
    r'(?P<string>"""(?:\\[\s\S]|[^\\])*?"""|\'\'\'(?:\\[\s\S]|[^\\])*?\'\'\''
    r'|"(?:\\[\s\S]|[^"\\\n])*"|\'(?:\\[\s\S]|[^\'\\\n])*\')'
    r"|(?P<comment>#[^\n]*)|(?P<open>[(\[{])|(?P<close>[)\]}])"
)
_STATEMENT_START = re.compile(r"[ \t]*[rRbBuUfF]{0,2}")


def doc_lines(path: str, text: str) -> list[tuple[int, str]]:
    """(line number, text) of what is read in a file: in .py, its docstrings and comments."""
    if not path.endswith(".py"):
        return list(enumerate(text.splitlines(), 1))
    starts = [0, *(m.end() for m in re.finditer("\n", text))]  # each line's offset
    found: list[tuple[int, str]] = []
    depth = 0
    for m in _PY.finditer(text):
        if m.lastgroup == "open":
            depth += 1
        elif m.lastgroup == "close":
            depth = max(0, depth - 1)
        elif m.lastgroup == "comment":
            found.append((bisect.bisect_right(starts, m.start()), m.group()))
        else:
            first = bisect.bisect_right(starts, m.start())
            if depth or not _STATEMENT_START.fullmatch(text, starts[first - 1], m.start()):
                continue
            last = bisect.bisect_right(starts, m.end() - 1)
            end = starts[last] - 1 if last < len(starts) else len(text)
            found += enumerate(text[starts[first - 1] : end].split("\n"), first)
    return found


def _module_exists(repo: Repository, dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] == "gclm" and len(parts) > 1 and parts[1] in MODULE_FOLDERS:
        folder, rest = MODULE_FOLDERS[parts[1]], parts[2:]
    else:
        folder, rest = parts[0], parts[1:]
    for i, part in enumerate(rest):
        if part.isupper():  # a placeholder: `python -m bench.NAME`
            return True
        if f"{folder}/{part}" in repo.folders:
            folder = f"{folder}/{part}"
        elif f"{folder}/{part}.py" in repo.files:
            nxt = rest[i + 1 : i + 2]
            return not nxt or repo.defines(f"{folder}/{part}.py", nxt[0])
        else:  # a name the package's __init__ holds
            init = f"{folder}/__init__.py"
            return init in repo.files and repo.defines(init, part)
    return True


def _rooted_exists(repo: Repository, path: str) -> bool:
    if "__pycache__" in path.split("/"):
        return True
    if "*" in path:
        return any(fnmatch.fnmatchcase(f, path) for f in repo.files)
    if repo.has(path):
        return True
    module, _, name = path.rpartition(".")  # compiler/grown/state_walk.walk_trie
    return bool(name) and f"{module}.py" in repo.files and repo.defines(f"{module}.py", name)


def wrong_paths(repo: Repository, path: str, text: str) -> list[str]:
    """'file:line: token (rule)' for each path in `text` (the file `path`) that names
    nothing in `repo`."""
    wrong = []
    folder = posixpath.dirname(path)
    for number, line in doc_lines(path, text):
        if "/" not in line and ".py" not in line and "gclm." not in line and "bench." not in line:
            continue  # nothing any rule reads: most lines

        def bad(token: str, rule: str, number: int = number) -> None:
            wrong.append(f"{path}:{number}: {token} ({rule})")

        for m in ROOTED.finditer(line):
            token = m.group(0).rstrip(".-")
            if not _rooted_exists(repo, token):
                bad(token, "no such file or folder")
        for m in PARTIAL.finditer(line):
            token = m.group(0)
            if token.split("/", 1)[0] in (*TOP, "build"):
                continue
            if not any(f == token or f.endswith("/" + token) for f in repo.files):
                bad(token, "no tracked path ends so")
        if path.endswith(".md"):
            for m in RELATIVE.finditer(line):
                token = m.group(0).rstrip(".")
                target = posixpath.normpath(posixpath.join(folder, token))
                if not repo.has(target):
                    bad(token, f"{target}: no such file or folder")
        for m in BARE.finditer(line):
            if m.group(0) not in repo.names:
                bad(m.group(0), "no tracked file has this name")
        for m in MODULE.finditer(line):
            token = m.group(0)
            if not _module_exists(repo, token):
                bad(token, "no such module or name")
        for m in OWNER.finditer(line):
            owner, name = m.group(1) or m.group(4), m.group(2) or m.group(3) or m.group(5)
            if owner in repo.files and not repo.defines(owner, name):
                bad(f"{owner}'s {name}", "not in that file")
    return wrong


def test_every_path_the_docs_name_exists() -> None:
    repo = _tracked()
    wrong = [w for path in _scanned(repo) for w in wrong_paths(repo, path, repo.text(path))]
    assert not wrong, (
        "these docstrings, comments or pages name paths that do not exist; point them at "
        "the file that now holds the thing (rules in tests/test_docs_paths.py):\n"
        + "\n".join(wrong)
    )


def test_the_rules_catch_a_stale_path(tmp_path: Path) -> None:
    files = {
        "masking/graceful.py": "class GracefulPolicy: ...\n",
        "server/openai/chat/render.py": "",
        "compiler/service/warm.py": "",
        "compiler/__init__.py": "from gclm.compiler.front.constraint import Constraint\n",
        "bench/results/budget.md": "",
    }
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    repo = Repository(tmp_path, frozenset(files))
    text = (
        '"""`masking/slack.py`\'s `SlackPolicy`, `masking/graceful.py`\'s `SlackPolicy`;\n'
        "chat/render.py, chat/reasoning.py, responses_render.py and render.py; and/or, tok/s,\n"
        "$OUT/x.json, https://example.com/docs/x.md, build/out.json;\n"
        "compiler/**/*.py, docs/*.txt;\n"
        'python -m gclm.compiler.warm, gclm.compiler.service.warm, gclm.compiler.Constraint."""\n'
        "# tests/test_x.py::test_y, server/__pycache__/x.pyc, masking/graceful.GracefulPolicy\n"
        "# masking/graceful.py's own rule, masking/graceful.py's slack_policy\n"
        "x = 'masking/string_literals_are_code.py'\n"
        "call(\n    '''\n# masking/not_a_comment.py\n'''\n)\n"
    )
    assert wrong_paths(repo, "masking/example.py", text) == [
        "masking/example.py:1: masking/slack.py (no such file or folder)",
        "masking/example.py:1: masking/graceful.py's SlackPolicy (not in that file)",
        "masking/example.py:2: chat/reasoning.py (no tracked path ends so)",
        "masking/example.py:2: responses_render.py (no tracked file has this name)",
        "masking/example.py:4: docs/*.txt (no such file or folder)",
        "masking/example.py:5: gclm.compiler.warm (no such module or name)",
        "masking/example.py:6: tests/test_x.py (no such file or folder)",
        "masking/example.py:7: masking/graceful.py's slack_policy (not in that file)",
    ]
    page = "[budget](../bench/results/budget.md), [gone](../bench/results/gone.md)\n"
    assert wrong_paths(repo, "docs/first-mask.md", page) == [
        "docs/first-mask.md:1: ../bench/results/gone.md "
        "(bench/results/gone.md: no such file or folder)"
    ]


def test_the_first_mask_page_stays_short() -> None:
    """docs/first-mask.md explains the design; dated figures live in bench/results/."""
    lines = (ROOT / "docs/first-mask.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"docs/first-mask.md is {lines} lines; the limit is 200"

"""The package layout the design card promises: one `gclm` namespace, no import cycles."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each installed package's sources live in the repository.
PACKAGES = {
    "gclm": "gclm",
    "gclm.server": "server",
    "gclm.compiler": "compiler",
    "gclm.masking": "masking",
}


def _modules() -> dict[str, Path]:
    """Every gclm module name -> its file."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            if package == "gclm" and path.parent != ROOT / "gclm":
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The gclm modules `name` imports at module level (TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    body = list(tree.body)
    while body:
        node = body.pop()
        if isinstance(node, ast.If | ast.Try):
            body += node.body + node.orelse + getattr(node, "handlers", [])
        elif isinstance(node, ast.ExceptHandler):
            body += node.body
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in modules and m != name}


def test_no_module_imports_itself_back_through_a_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # A package's __init__ re-exporting its own modules is not a cycle back into itself.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = trail[trail.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert "gclm.compiler.front.json_schema.normalize" in graph  # the walk saw the subpackages


def test_no_sys_path_edits() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("gclm", "server", "compiler", "masking", "tests", "bench")
        for path in (ROOT / folder).rglob("*.py")
        if "sys.path" in path.read_text() and path != Path(__file__).resolve()
    ]
    assert offenders == []


def test_wheel_installs_only_the_gclm_namespace(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in PACKAGES.values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("gclm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"gclm", wheel.name.split("-py")[0] + ".dist-info"}
    installed = {n.removeprefix("gclm/") for n in names if n.endswith(".py")}
    expected = {
        str(Path(package.replace(".", "/")).relative_to("gclm") / p.relative_to(ROOT / folder))
        if package != "gclm"
        else p.name
        for package, folder in PACKAGES.items()
        for p in (ROOT / folder).rglob("*.py")
        if package != "gclm" or p.parent == ROOT / "gclm"
    }
    assert installed == expected


def test_public_api_imports_from_gclm_in_a_fresh_interpreter(tmp_path: Path) -> None:
    # From another directory, so that only the installed package can answer.
    code = (
        "import sys, importlib.util as u, gclm; "
        "assert 'torch' not in sys.modules, 'import gclm must stay light'; "
        "from gclm import create_constraint, Constraint, GclmError, BudgetTooSmallError; "
        "assert all(u.find_spec(n) is None for n in ('server', 'compiler', 'masking'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_every_error_class_is_exported_from_gclm() -> None:
    import inspect

    import gclm
    import gclm.errors

    classes = {
        name
        for name, value in inspect.getmembers(gclm.errors, inspect.isclass)
        if issubclass(value, gclm.errors.GclmError)
    }
    assert classes <= set(gclm.__all__)


# The layers, lowest first: a module may import its own layer and the ones below, never
# one above. `gclm` itself (its __init__) is the facade over all of them.
LAYERS = (
    ("gclm.errors", "gclm.paths"),
    ("gclm.compiler",),
    ("gclm.masking",),
    ("gclm.server",),
)


def _layer(module: str) -> int:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return len(LAYERS)  # the facade, above everything


def _all_imports(path: Path) -> set[str]:
    """Every gclm module named by an import anywhere in the file (inside functions too:
    a lazy import still ties the layers together)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {m for m in found if m == "gclm" or m.startswith("gclm.")}


def layering_violations(modules: dict[str, Path]) -> list[str]:
    """'importer -> imported' for each import of a higher layer than the importer's."""
    return sorted(
        f"{name} -> {target}"
        for name, path in modules.items()
        for target in _all_imports(path)
        if _layer(target) > _layer(name)
    )


def test_no_layer_imports_a_layer_above_it() -> None:
    """compiler <- masking <- server: compiler imports neither masking nor server, and
    masking does not import server."""
    modules = _modules()
    assert {_layer(m) for m in modules} == set(range(len(LAYERS) + 1))  # every layer seen
    assert layering_violations(modules) == []


def test_the_layering_check_catches_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from gclm.compiler.whole.tables import CompiledTable\n"
        "def tables():\n"
        "    from gclm.server.settings import ServerSettings\n"
        "    import gclm.masking.state\n"
    )
    assert layering_violations({"gclm.compiler.bad": bad}) == [
        "gclm.compiler.bad -> gclm.masking.state",
        "gclm.compiler.bad -> gclm.server.settings",
    ]
    assert layering_violations({"gclm.server.bad": bad}) == []


def test_no_module_walks_stack_frames_or_sniffs_sys_modules() -> None:
    """The package asks its callers and its tables nothing behind their backs: no frame
    walks (sys._getframe, inspect.currentframe/stack) and no sys.modules lookups to tell
    one kind of object from another."""
    banned = ("sys._getframe", "inspect.currentframe", "inspect.stack", "sys.modules")
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _modules().values()
        for name in banned
        if name in path.read_text()
    ]
    assert found == []


def test_only_the_builders_ask_which_table_they_hold() -> None:
    """Whole table or first masks is decided where mask sources are made (masking/masks.py)
    and where a request's constraint is prepared (server/engine/prepare.py, and the
    constraint service that builds mask rows for whole tables); everything else reads the
    MaskSource protocol (masking/source.py)."""
    allowed = {"masking/masks.py", "server/engine/prepare.py", "server/engine/constraints.py"}
    asking = re.compile(r"isinstance\([^)]*\b(CompiledTable|LazyTable|MaskTable)\b")
    found = sorted(
        str(path.relative_to(ROOT))
        for path in _modules().values()
        if path.parts[len(ROOT.parts)] in ("server", "masking")
        and str(path.relative_to(ROOT)) not in allowed
        and asking.search(path.read_text())
    )
    assert found == []

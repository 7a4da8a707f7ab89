"""The package's import graph is a layered DAG (docs/design.md "Layers").

Four checks, each reporting every violation it finds:

- the import-linter contracts of pyproject.toml (``[tool.importlinter]``: the layer table, a module
  imports only from its own layer or below, and siblings joined by "|" not each other; and the
  command split: train / aot / convert import no game, and ``commands/cli.py`` is the bottom of the
  commands), run through import-linter's own entry point (the same check as ``lint-imports``);
- no import cycle between the package's modules (grimp's graph, which counts imports inside
  functions too): every strongly connected component has one module;
- imports inside functions only of optional heavy third-party modules (:data:`OPTIONAL_HEAVY`),
  each with a trailing comment that says why (``import torch  # optional``);
- no module that only re-exports another (an alias of an old path).

And one of the tests: no test module imports another (shared code lives in tests/*_helpers.py and
conftest.py).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tokenize
import tomllib
from collections.abc import Iterator, Mapping, Set

import grimp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "animegamer_jax"
PYPROJECT = os.path.join(ROOT, "pyproject.toml")

#: third-party modules that may be imported inside a function: optional extras (pyproject.toml
#: ``torch``, ``serve``, ``test``) or heavy libraries only one code path needs
OPTIONAL_HEAVY = ("torch", "torchvision", "transformers", "diffusers", "peft", "safetensors.torch", "selenium",
                  "uvicorn", "starlette", "cv2", "av", "tensorflow", "tensorflow_datasets", "apache_beam", "skvideo",
                  "scenedetect")


def test_import_linter_contract():
    with open(PYPROJECT, "rb") as f:
        tool = tomllib.load(f).get("tool", {})
    assert "importlinter" in tool, "pyproject.toml has no [tool.importlinter] section (the layer contract)"
    assert tool["importlinter"].get("contracts"), "[tool.importlinter] defines no contract"
    # its own process: import-linter's console takes over sys.stdout / sys.stderr, which pytest captures
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                          "sys.exit(lint_imports_command())", "--config", PYPROJECT, "--no-cache"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"the layer contract is broken:\n{res.stdout}{res.stderr}"
    assert "4 kept, 0 broken" in res.stdout, res.stdout


def test_cli_is_the_bottom_of_the_commands():
    """The command pattern (``commands/cli.py``) is the lowest layer of the commands and no layer of the
    package: the layer table's top-level layers name every package but no ``cli``, so nothing below
    ``commands`` can import it."""
    with open(PYPROJECT, "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (top,) = [c for c in contracts if c.get("containers") == [PACKAGE]]
    (commands,) = [c for c in contracts if c.get("containers") == [f"{PACKAGE}.commands"]]
    assert commands["layers"][-1] == "cli"
    names = {n.strip() for layer in top["layers"] for n in layer.split("|")}
    package = os.path.join(ROOT, PACKAGE)
    assert not os.path.exists(os.path.join(package, "cli.py"))
    assert os.path.isfile(os.path.join(package, "commands", "cli.py"))
    assert "cli" not in names and "commands" in names and "game" in names


def strongly_connected_components(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative): the strongly connected components of ``graph`` (node -> the
    nodes it has an edge to), each sorted, in no particular order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
    return out


def test_strongly_connected_components():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}}
    assert sorted(strongly_connected_components(graph)) == [["a", "b", "c"], ["d"], ["e"]]


def test_no_import_cycles():
    sys.path.insert(0, ROOT)
    try:
        graph = grimp.build_graph(PACKAGE, cache_dir=None)
    finally:
        sys.path.remove(ROOT)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = sorted(c for c in strongly_connected_components(edges) if len(c) > 1)
    lines = []
    for c in cycles:
        members = set(c)
        lines.append(f"cycle of {len(c)} modules:")
        for m in c:
            for target in sorted(edges[m] & members):
                detail = graph.get_import_details(importer=m, imported=target)
                where = ", ".join(f"line {d['line_number']}" for d in detail) or "?"
                lines.append(f"  {m} -> {target} ({where})")
    assert not cycles, f"{len(cycles)} import cycle(s) in {PACKAGE}:\n" + "\n".join(lines)


def dynamic_imports_of_the_package(root: str) -> list[str]:
    """``path:line`` of every ``importlib.import_module`` / ``runpy.run_module`` / ``__import__`` call
    under ``root`` whose module is a string naming the package: an import the layer contract and the
    cycle check cannot see."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                fn = node.func
                called = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                arg = node.args[0]
                if (called in ("import_module", "run_module", "__import__") and isinstance(arg, ast.Constant)
                        and isinstance(arg.value, str) and arg.value.split(".")[0] == PACKAGE):
                    out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_dynamic_import_check_finds_what_it_should(tmp_path):
    (tmp_path / "m.py").write_text("import importlib, runpy\n\nimportlib.import_module('animegamer_jax.data')\n"
                                   "runpy.run_module('animegamer_jax.commands.web', run_name='__main__')\n"
                                   "importlib.import_module('json')\n")
    rel = os.path.relpath(str(tmp_path / "m.py"), ROOT)
    assert dynamic_imports_of_the_package(str(tmp_path)) == [
        f"{rel}:3: importlib.import_module('animegamer_jax.data')",
        f"{rel}:4: runpy.run_module('animegamer_jax.commands.web', run_name='__main__')"]


@pytest.mark.slow
def test_no_dynamic_imports_of_the_package():
    found = dynamic_imports_of_the_package(os.path.join(ROOT, PACKAGE))
    assert not found, "imports by name that bypass the layer contract (import the module instead):\n" + "\n".join(found)


def reexport_only_modules(root: str) -> list[str]:
    """Modules under ``root`` whose body is only imports (besides a docstring, ``__all__`` and an
    ``if __name__ == "__main__"`` block) of which one is from the package: a re-export of another
    module's names under an old path. Package ``__init__`` files are exempt."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py") and f != "__init__.py"):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                body = ast.parse(f.read(), path).body
            rest = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
                    and not (isinstance(n, ast.Assign) and [getattr(t, "id", "") for t in n.targets] == ["__all__"])
                    and not (isinstance(n, ast.If) and "__name__" in ast.unparse(n.test))]
            imports = [n for n in rest if isinstance(n, (ast.Import, ast.ImportFrom))]
            ours = [n for n in imports if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").split(".")[0]
                                                                             == PACKAGE)]
            if rest and len(imports) == len(rest) and ours:
                out.append(os.path.relpath(path, ROOT))
    return out


def test_reexport_check_finds_what_it_should(tmp_path):
    (tmp_path / "alias.py").write_text('"""Old name."""\nfrom animegamer_jax.io.paths import *  # noqa\n')
    (tmp_path / "main_alias.py").write_text("from animegamer_jax.commands.web import cli\n\nif __name__ == '__main__':\n"
                                            "    cli()\n")
    (tmp_path / "real.py").write_text("from animegamer_jax import paths\n\nX = paths\n")
    (tmp_path / "__init__.py").write_text("from animegamer_jax.io.paths import resource\n")
    rel = os.path.relpath(str(tmp_path), ROOT)
    assert reexport_only_modules(str(tmp_path)) == [f"{rel}/alias.py", f"{rel}/main_alias.py"]


@pytest.mark.slow
def test_no_module_only_reexports():
    """No alias modules: a module that only re-exports another's names under an old path is gone
    (docs/changelog.md says what to import instead)."""
    found = reexport_only_modules(os.path.join(ROOT, PACKAGE))
    assert not found, "modules that only re-export another module (import the module itself):\n" + "\n".join(found)


def _comment_lines(source: str) -> set[int]:
    """Line numbers that hold a ``#`` comment (tokenize: not a ``#`` inside a string)."""
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT}


def _function_imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement inside a function (at any depth) and the function's name."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    yield sub, node.name


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: the package itself
        return ["." * node.level + (node.module or "")]
    return [node.module or ""]


def _optional_heavy(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in OPTIONAL_HEAVY)


def local_import_violations(root: str) -> list[str]:
    """``path:line: ...`` for every function-local import under ``root`` that is not of an
    :data:`OPTIONAL_HEAVY` module with a trailing comment (each statement once: a nested function's
    import is reported for its innermost function only)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            rel = os.path.relpath(path, ROOT)
            comments = _comment_lines(source)
            for node, func in _function_imports(ast.parse(source, path)):
                modules = _imported(node)
                commented = any(n in comments for n in range(node.lineno, (node.end_lineno or node.lineno) + 1))
                if all(_optional_heavy(m) for m in modules):
                    if commented:
                        continue
                    why = "optional import without a trailing reason comment"
                else:
                    why = "function-local import of a non-optional module"
                out[(rel, node.lineno)] = f"{rel}:{node.lineno}: {why}: {ast.unparse(node)} (in {func}())"
    return [out[k] for k in sorted(out)]


def test_local_import_check_finds_what_it_should(tmp_path):
    (tmp_path / "m.py").write_text(
        "import json\n\n\ndef f():\n    import torch  # optional\n    import cv2\n"
        "    from animegamer_jax import paths\n    from . import sibling  # optional\n\n\n"
        "def g():\n    import safetensors.torch  # optional\n    import numpy as np\n")
    found = local_import_violations(str(tmp_path))
    rel = os.path.relpath(str(tmp_path / "m.py"), ROOT)
    assert found == [
        f"{rel}:6: optional import without a trailing reason comment: import cv2 (in f())",
        f"{rel}:7: function-local import of a non-optional module: from animegamer_jax import paths (in f())",
        f"{rel}:8: function-local import of a non-optional module: from . import sibling (in f())",
        f"{rel}:13: function-local import of a non-optional module: import numpy as np (in g())",
    ]


@pytest.mark.slow
def test_function_local_imports_only_of_optional_heavy_modules():
    found = local_import_violations(os.path.join(ROOT, PACKAGE))
    assert not found, (f"{len(found)} function-local import(s) that belong at module level (or need a reason "
                       f"comment):\n" + "\n".join(found))


# `from tests.test_x import ...`, `import test_x`, and captioner specs `py:tests.<test module>:NAME`, anywhere in the
# text: source run by child processes is a string of the test module and counts too.
TEST_MODULE_IMPORT = re.compile(r"^\s*(?:from|import)\s+(?:tests\.)?(test_\w+)|py:tests\.(test_\w+)", re.M)


def imported_test_modules(text: str) -> list[str]:
    """The test modules (``test_*``) that the Python source ``text`` imports, sorted, each once."""
    return sorted({a or b for a, b in TEST_MODULE_IMPORT.findall(text)})


def test_test_module_import_check_finds_what_it_should():
    text = ("import os\nfrom tests.train_helpers import SETUP\nfrom tests.test_train import Toy\nCHILD = \"\"\"\n"
            "    import test_web\n\"\"\"\nSPEC = 'py:tests." "test_label:rule'\nx = 'test_configs'  # not an import\n")
    assert imported_test_modules(text) == ["test_label", "test_train", "test_web"]


def test_test_modules_do_not_import_each_other():
    """A test module imported by another ties the two files together (and pytest collects the tests it
    imports twice): what several share goes into a helper module or a conftest.py fixture."""
    tests = os.path.join(ROOT, "tests")
    found = {}
    for name in sorted(os.listdir(tests)):
        if name.endswith(".py"):
            with open(os.path.join(tests, name), encoding="utf-8") as f:
                if imported := imported_test_modules(f.read()):
                    found[name] = imported
    assert not found, f"test modules importing test modules (move what they share to a helper module): {found}"

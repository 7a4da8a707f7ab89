"""docs/ stays the one place the code cites: every `docs/<file>.md#<anchor>` reference in the repository
and every link between the docs resolves to an existing file and heading, the code paths the docs name
exist, and nothing points at the fact sheet outside the repository any more."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
#: folders whose text files may cite docs/ (build outputs, data sets and the venv are not scanned)
SCANNED_DIRS = ("animegamer_jax", "tests", "benchmarks", "configs", "docs", "launch", "data", ".ci")
SCANNED_SUFFIXES = (".py", ".md", ".sh", ".toml", ".txt", ".cfg", ".yaml", ".yml", ".json")
SKIPPED_DIRS = {"__pycache__", "prepared", ".venv", "node_modules", ".git"}
#: the outside fact sheet's file name, built so that this file does not match itself
OUTSIDE_SHEET = "architecture" + ".md"

#: `docs/<file>.md#<anchor>` of this repository (not `../shared/docs/...`, the workplace's own notes)
DOC_REF = re.compile(r"(?<!shared/)docs/([A-Za-z0-9_\-]+\.md)(#[A-Za-z0-9_\-]+)?")
MD_LINK = re.compile(r"\]\(([A-Za-z0-9_\-]+\.md)?(#[A-Za-z0-9_\-]+)?\)")
CODE_PATH = re.compile(r"`((?:animegamer_jax|models|convert|game|train|diffusion|eval|data|tests|benchmarks|configs|parallel|web)"
                       r"/[A-Za-z0-9_./\-]*?(?:\.py|/))`")


def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Anchors of every heading of a markdown file (duplicates get GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
    return out


def scanned_files():
    for name in sorted(os.listdir(ROOT)):
        p = os.path.join(ROOT, name)
        if os.path.isfile(p) and (name.endswith(SCANNED_SUFFIXES) or name == "Makefile"):
            yield p
    for d in SCANNED_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = [x for x in dirnames if x not in SKIPPED_DIRS]
            for fn in sorted(filenames):
                if fn.endswith(SCANNED_SUFFIXES):
                    yield os.path.join(dirpath, fn)


@pytest.fixture(scope="module")
def texts():
    out = {}
    for p in scanned_files():
        if os.path.getsize(p) > 2_000_000:
            continue
        with open(p, encoding="utf-8", errors="replace") as f:
            out[os.path.relpath(p, ROOT)] = f.read()
    return out


@pytest.fixture(scope="module")
def doc_anchors():
    return {fn: anchors(os.path.join(DOCS, fn)) for fn in os.listdir(DOCS) if fn.endswith(".md")}


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def test_slug_matches_github():
    assert slug("Motion level to flow") == "motion-level-to-flow"
    assert slug("Tokenizer and special tokens") == "tokenizer-and-special-tokens"
    assert slug("v-prediction") == "v-prediction"
    assert slug("Table 1") == "table-1"
    assert slug("One turn, end to end (§0)") == "one-turn-end-to-end-0"


def test_no_reference_to_the_outside_fact_sheet(texts):
    bad = [f"{rel}:{_line(t, m.start())}" for rel, t in texts.items() for m in re.finditer(re.escape(OUTSIDE_SHEET), t)]
    assert not bad, (f"{len(bad)} references to {OUTSIDE_SHEET} (not in the repository); point them at "
                     f"docs/<file>.md#<heading> instead (docs/README.md lists where each old section lives): {bad}")


def test_no_reference_to_notes_outside_the_repository(texts):
    """The workplace's notes beside the checkout (../shared/docs: design, environment, style) are not
    shipped; their facts live in docs/ and the README. (The release fixture in ../shared/fixtures is
    test data, not a citation, and stays.)"""
    outside = re.compile(r"shared/docs/")
    bare = re.compile(r"(?<![\w/])(?:design|environment|style)\.md")  # inside docs/, design.md is ours
    bad = [f"{rel}:{_line(t, m.start())}: {m.group(0)}" for rel, t in texts.items()
           if rel != os.path.join("tests", "test_docs.py")
           for pat in ((outside,) if rel.startswith("docs" + os.sep) else (outside, bare)) for m in pat.finditer(t)]
    assert not bad, "references to notes outside the repository (cite docs/<file>.md#<heading>):\n" + "\n".join(bad)


def test_section_signs_cite_the_paper(texts):
    """A bare `§1.3` was a section of the outside fact sheet; in code, tests and the README a section
    sign now only cites the paper ("paper §3.2", "§3.3 of the paper")."""
    bad = []
    for rel, t in texts.items():
        if rel.startswith("docs" + os.sep) or rel == os.path.join("tests", "test_docs.py"):
            continue
        for m in re.finditer(r"§\s*\d", t):
            around = t[max(0, m.start() - 12):m.end() + 16]
            if not re.search(r"paper(?:'s)?\s*§|§\s*[\d.]+\s+of the paper", around, re.I):
                bad.append(f"{rel}:{_line(t, m.start())}: ...{around.strip()}...")
    assert not bad, ("bare section numbers (write docs/<file>.md#<heading>, see docs/README.md "
                     "'Older section numbers', or 'paper §N'):\n" + "\n".join(bad))


def test_every_docs_reference_resolves(texts, doc_anchors):
    bad, count = [], 0
    for rel, t in texts.items():
        for m in DOC_REF.finditer(t):
            count += 1
            fn, anchor = m.group(1), m.group(2)
            where = f"{rel}:{_line(t, m.start())} {m.group(0)}"
            if fn not in doc_anchors:
                bad.append(f"{where}: no file docs/{fn}")
            elif anchor and anchor[1:] not in doc_anchors[fn]:
                bad.append(f"{where}: docs/{fn} has no heading '{anchor[1:]}'")
    assert count > 50, f"only {count} docs/ references found; is the scan looking in the right place?"
    assert not bad, "\n".join(bad)


def test_links_between_docs_resolve(doc_anchors):
    bad = []
    for fn in sorted(doc_anchors):
        with open(os.path.join(DOCS, fn), encoding="utf-8") as f:
            t = f.read()
        for m in MD_LINK.finditer(t):
            target = m.group(1) or fn
            anchor = m.group(2)
            if target not in doc_anchors:
                bad.append(f"docs/{fn}:{_line(t, m.start())}: link to missing {target}")
            elif anchor and anchor[1:] not in doc_anchors[target]:
                bad.append(f"docs/{fn}:{_line(t, m.start())}: {target} has no heading '{anchor[1:]}'")
    assert not bad, "\n".join(bad)


def test_code_paths_named_in_docs_exist(doc_anchors):
    """A path in backticks (`models/mistral/mllm.py`, `animegamer_jax/diffusion/`) names a file or folder of
    the repository, at the root or under animegamer_jax/: moved code must take its docs along. The changelog
    is left out: it names old paths on purpose."""
    bad = []
    for fn in sorted(set(doc_anchors) - {"changelog.md"}):
        with open(os.path.join(DOCS, fn), encoding="utf-8") as f:
            t = f.read()
        for m in CODE_PATH.finditer(t):
            p = m.group(1)
            if not any(os.path.exists(os.path.join(ROOT, base, p)) for base in ("", "animegamer_jax")):
                bad.append(f"docs/{fn}:{_line(t, m.start())}: {p}")
    assert not bad, "paths named in docs/ that do not exist (update the doc with the code):\n" + "\n".join(bad)


PACKAGE = os.path.join(ROOT, "animegamer_jax")
#: a backticked folder (`animegamer_jax/data/`, `models/t5/`) and a backticked module (`loader.py`, `data/loader.py`)
MAP_FOLDER = re.compile(r"`(?:animegamer_jax/)?((?:[A-Za-z0-9_]+/)*)`")
MAP_MODULE = re.compile(r"`(?:animegamer_jax/)?((?:[A-Za-z0-9_]+/)*[A-Za-z0-9_]+\.py)`")


def package_modules() -> set[str]:
    """Every module of the package as its path under animegamer_jax/ (`data/loader.py`), `__init__.py` aside."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(PACKAGE):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        for fn in filenames:
            if fn.endswith(".py") and fn != "__init__.py":
                out.add(os.path.relpath(os.path.join(dirpath, fn), PACKAGE).replace(os.sep, "/"))
    return out


def map_modules(section: str) -> set[str]:
    """The modules a design.md map names: a path (`models/t5/model.py`, with or without `animegamer_jax/`),
    or a bare file name in a line (a table row) that names its folder (`inference/` ... `mllm_turn.py`);
    a bare name in a line without a folder is a top-level module (`config.py`)."""
    out = set()
    for line in section.splitlines():
        folders = [m.group(1) for m in MAP_FOLDER.finditer(line)] or [""]
        for m in MAP_MODULE.finditer(line):
            name = m.group(1)
            if "/" in name:
                out.add(name)
            else:
                out.update(folder + name for folder in folders)
    return out


def test_map_parser_reads_paths_and_rows():
    row = "| `inference/` | `mllm_turn.py` | the MLLM turn; `models/t5/model.py` and `animegamer_jax/io/paths.py` |"
    assert map_modules(row) == {"inference/mllm_turn.py", "models/t5/model.py", "io/paths.py"}
    assert map_modules("| `animegamer_jax/` | `config.py` | |\n| x | `cli.py` |") == {"config.py", "cli.py"}


def test_design_map_lists_every_module():
    """docs/design.md "Where the code lives" names every module of animegamer_jax/ and none that is gone: a
    module added, moved or removed takes its row along (the package docstrings list no modules)."""
    with open(os.path.join(DOCS, "design.md"), encoding="utf-8") as f:
        t = f.read()
    start = t.index("\n## Where the code lives")
    section = t[start:t.index("\n## ", start + 1)]
    listed, present = map_modules(section), package_modules()
    assert len(present) > 100, f"only {len(present)} modules found under {PACKAGE}"
    missing = sorted(present - listed)
    gone = sorted(m for m in listed - present if not os.path.exists(os.path.join(ROOT, m)))
    assert not missing, ("modules missing from docs/design.md's map (add a row to 'Module by module'):\n"
                         + "\n".join(missing))
    assert not gone, "docs/design.md's map names modules that do not exist:\n" + "\n".join(gone)


def test_package_docstrings_are_one_line():
    """A package's `__init__.py` says what the package is in one line; its modules are listed in
    docs/design.md's map (a list in a docstring goes stale when modules come and go)."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(PACKAGE):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        if "__init__.py" in filenames:
            p = os.path.join(dirpath, "__init__.py")
            with open(p, encoding="utf-8") as f:
                doc = ast.get_docstring(ast.parse(f.read()))
            if not doc or "\n" in doc.strip():
                bad.append(os.path.relpath(p, ROOT))
    assert not bad, "package docstrings that are missing or longer than one line:\n" + "\n".join(sorted(bad))

#!/usr/bin/env python3
"""Split ``hub/`` into layered sub-packages and move the simulator under ``placement/sim/``
(issue 22 item 2), from the one mapping table below.

Usage, from a clean checkout: ``python3 scripts/relayout.py [--no-tools]``

What it does, in order (each step is idempotent: a second run changes nothing):

1. refuses to start when ``hub/`` or ``placement/`` holds a ``.py`` module the table does not
   place (a module added since the table was written: add it to ``HUB`` or ``SIM`` first);
2. ``git mv`` every module of the table to its new folder and writes each sub-package's
   ``__init__.py`` (a one-line docstring);
3. rewrites every git-tracked text file (code, tests, docs, pyproject, Makefile, charts):
   dotted names (``gpufed.hub.store`` -> ``gpufed.hub.adapters.store``, also inside strings such
   as monkeypatch targets and import-linter rules), ``from gpufed.hub import store, status``
   (split per sub-package) and paths (``hub/store.py`` -> ``hub/adapters/store.py``); the
   generated CRDs are not edited but regenerated (step 6);
4. pyproject.toml: the sub-packages in ``[tool.setuptools]`` ``packages`` and ``package-dir``,
   and two import-linter contracts (``NEW_CONTRACTS``): the hub's layers, and the placement
   engine does not import the simulator;
5. docs/design.md: the layers row in §12 (and its count of contracts), the layout in §1 and the
   sub-packages in §9; the hub package's docstring;
6. unless ``--no-tools``: ``scripts/gen_crds.py`` (the CRDs quote ``hub/rules/status.py``) and
   ``ruff check --select I --fix`` + ``ruff format`` on the Python files it changed (longer
   module paths re-sort and re-wrap imports), with ``.venv/bin`` tools when present.

Re-install afterwards (``make install``: strict editable mode links each package's files).
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# The one mapping table: old module (folder/name.py) -> its sub-package. Module names do not
# change; no sub-package is named like a module it replaces, so every rewrite below is
# idempotent (``gpufed.hub.adapters`` never matches an old name).
# ---------------------------------------------------------------------------------------------

#: hub/<module>.py -> hub/<layer>/<module>.py, layers highest first (docs/design.md §9).
HUB: dict[str, tuple[str, ...]] = {
    # The process and its transport edge: wiring, the gRPC servicer, HTTP, leader election,
    # certificates, logs, the replica's Pod role. Imports everything below it.
    "edge": ("app", "service", "http", "leader", "certs", "log", "podrole"),
    # One leader term: the Controller, the Term and the state it shares, and the components it
    # builds (each owns one concept), with the configuration and metrics they read and write.
    "components": (
        "core",
        "term",
        "config",
        "metrics",
        "state",
        "reservations",
        "intake",
        "namespaces",
        "priorities",
        "queues",
        "tokens",
        "members",
        "member_status",
        "reports",
        "dispatch",
        "requeue",
        "restarts",
        "deletion",
        "preemption",
        "scheduling",
        "suspects",
        "mirror",
        "rebuild",
    ),
    # The term's ports (Protocols) and what implements them: etcd, the hub API server, the
    # list+watch loop, the coalescing writer, one agent stream. No component is imported here.
    "adapters": ("ports", "store", "etcd", "kube", "listwatch", "writer", "sessions"),
    # Pure rules and value models over gpufed.api and placement: no I/O, no adapter.
    "rules": ("status", "restart_status", "admission", "podsets", "health", "records"),
}
#: placement/<module>.py -> placement/sim/<module>.py: what only the simulator and the
#: placement benchmark use (the engine imports none of it).
SIM: tuple[str, ...] = (
    "simulate",
    "simfail",
    "simfirstadmit",
    "simpreempt",
    "simquota",
    "simreport",
    "siminvariants",
    "trace",
    "priomix",
    "bench",
    "synthetic",
)

#: Each sub-package's __init__.py docstring.
DOCSTRINGS = {
    "hub/edge": "The hub process and its transport edge: wiring, gRPC servicer, HTTP, leader election.",
    "hub/components": "One leader term: the Controller, the Term and its state, the components it builds.",
    "hub/adapters": "The term's ports (Protocols) and what implements them: etcd, hub API, agent streams.",
    "hub/rules": "Pure rules and value models: job status, admission, pod sets, member health, records.",
    "placement/sim": "The simulator and the placement benchmark: traces, synthetic fleets, offline runs.",
}

# (parent import package, its folder) -> {old module: new sub-package}
MOVES: dict[tuple[str, str], dict[str, str]] = {
    ("gpufed.hub", "hub"): {m: layer for layer, mods in HUB.items() for m in mods},
    ("gpufed.placement", "placement"): dict.fromkeys(SIM, "sim"),
}

#: Contracts added to pyproject.toml and rows added to docs/design.md §12: (the contract each
#: follows, its name, its TOML table with the comment above it, its §12 row).
NEW_CONTRACTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "protobuf stays at the hub's transport edge (service, sessions, app)",
        "hub layers: edge above components above adapters above rules",
        """
# The hub's sub-packages (docs/design.md §9), highest first: a layer imports only the layers
# below it, and every hub module is in one (exhaustive). The rules import no adapter.
[[tool.importlinter.contracts]]
name = "hub layers: edge above components above adapters above rules"
type = "layers"
containers = ["gpufed.hub"]
layers = ["edge", "components", "adapters", "rules"]
exhaustive = true
""",
        "| hub layers: edge above components above adapters above rules | `gpufed.hub` | "
        "`edge`, `components`, `adapters`, `rules`: a layer imports only the layers after it "
        "(every hub module is in one, §9) |",
    ),
    (
        "the invariant checker does not import the quota code it checks",
        "the placement engine does not import the simulator",
        """
# The simulator and the benchmark drive place() from placement/sim/; the engine they drive
# never depends on them (docs/design.md §1).
[[tool.importlinter.contracts]]
name = "the placement engine does not import the simulator"
type = "forbidden"
source_modules = ["gpufed.placement.*"]
forbidden_modules = ["gpufed.placement.sim"]
""",
        "| the placement engine does not import the simulator | `gpufed.placement.*` | "
        "`gpufed.placement.sim` (every other module of `placement/`; the wildcard leaves out "
        "`sim` itself) |",
    ),
)

#: docs/design.md: (anchor that must be present, text inserted right after it, marker that
#: says it is already there).
DESIGN_INSERTS: tuple[tuple[str, str, str], ...] = (
    (
        # §9, after its first paragraph.
        "Every module opens with a docstring that says which\nconcept it owns and who calls it.\n",
        """
**Layers.** The modules sit in four sub-packages of `hub/`, highest first; a layer imports only
the layers below it, which the import-linter contract "hub layers" checks (§12, exhaustive: a
new module must be placed in one):

1. `hub/edge/` — the process and its transport edge: `app.py`, `service.py`, `http.py`,
   `leader.py`, `certs.py`, `log.py`, `podrole.py`. No other layer imports them.
2. `hub/components/` — one leader term: `core.py`, `term.py`, `state.py`, every component `core`
   builds (including `tokens.py`, which `service.py` asks), and what they share: `config.py`,
   `metrics.py`, `namespaces.py`, `member_status.py` (over the members' state).
3. `hub/adapters/` — the term's ports and what implements them: `ports.py` (the Protocols),
   `store.py`, `etcd.py`, `kube.py`, `listwatch.py`, `writer.py`, and `sessions.py`, the agent
   stream's adapter (it stays one of the three modules the protobuf contract allows; it sits here
   and not in `edge/` because the components hold and send on sessions).
4. `hub/rules/` — pure rules and value models: `status.py`, `restart_status.py`,
   `admission.py`, `podsets.py`, `health.py` (member health from receive times, not the HTTP
   probes) and `records.py` (the etcd values: adapters store them, rules compute them, so they
   sit at the bottom). Rules import no adapter and no component.
""",
        "**Layers.** The modules sit in four sub-packages of `hub/`",
    ),
)
#: docs/design.md: (old text, new text) replaced once; skipped when the new text is present.
DESIGN_EDITS: tuple[tuple[str, str], ...] = (
    (
        "status mirroring (§9) |",
        "status mirroring; in four layered sub-packages, `edge/`, `components/`, `adapters/` and "
        "`rules/` (§9) |",
    ),
    (
        "also the simulator (`",
        "also, under `sim/` (`gpufed.placement.sim`, which the engine never imports: §12), the "
        "simulator (`",
    ),
    (
        "`simfail.py` node failures) and the placement benchmark |",
        "`simfail.py` node failures, `siminvariants.py` the invariant checker) and the placement "
        "benchmark (`bench.py` over `synthetic.py` fleets) |",
    ),
    (
        "`placement` also holds the simulator and\nthe benchmark harness, because both drive "
        "the same `place()`.",
        "`placement` also holds the simulator and\nthe benchmark harness (in `placement/sim/`), "
        "because both drive the same `place()`.",
    ),
)
#: Other files: (path, old text, new text), replaced once; skipped when the new text is present.
FILE_EDITS: tuple[tuple[str, str, str], ...] = (
    (
        "hub/__init__.py",
        'Imports ``gpufed.api``, ``gpufed.placement``, ``gpufed.sync``."""',
        "Imports ``gpufed.api``, ``gpufed.placement``, ``gpufed.sync``.\n\n"
        "Four sub-packages, highest layer first: ``edge`` (the process and its transport), "
        "``components``\n(one leader term), ``adapters`` (the ports and what implements them), "
        '``rules`` (pure rules\nand records); docs/design.md §9."""',
    ),
)
NUMBERS: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
)
NUMBERS += ("eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen")

#: Generated files: regenerated (step 6), never edited.
GENERATED = re.compile(r"^(manifests/crds/|charts/gpufed-hub/crds/)")
TEXT_SUFFIXES = {".py", ".pyi", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg", ".ini", ".sh"}
TEXT_NAMES = {"Makefile", "Dockerfile", "run"}


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def check_table() -> None:
    """Step 1: every module of hub/ and placement/ is either placed or known to stay."""
    problems = []
    for (_, folder), table in MOVES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = path.stem
            if name == "__init__":
                continue
            if folder == "hub" and name not in table:
                problems.append(f"{folder}/{name}.py is in no layer: add it to HUB")
            if folder == "placement" and name.startswith("sim") and name not in table:
                problems.append(f"{folder}/{name}.py looks like the simulator's: add it to SIM")
    if problems:
        sys.exit("relayout: stopped before changing anything:\n  " + "\n  ".join(problems))


def move_modules() -> list[str]:
    """Step 2: git mv and the sub-packages' __init__.py. Returns what it did."""
    done = []
    for (_, folder), table in MOVES.items():
        for module, sub in table.items():
            src = ROOT / folder / f"{module}.py"
            dst = ROOT / folder / sub / f"{module}.py"
            if src.exists() and dst.exists():
                sys.exit(f"relayout: both {src.relative_to(ROOT)} and {dst.relative_to(ROOT)}")
            if src.exists():
                dst.parent.mkdir(exist_ok=True)
                git("mv", str(src.relative_to(ROOT)), str(dst.relative_to(ROOT)))
                done.append(f"{folder}/{module}.py -> {folder}/{sub}/{module}.py")
            elif not dst.exists():
                print(f"relayout: WARNING {folder}/{module}.py is in the table but gone: skipped")
    for pkg, doc in DOCSTRINGS.items():
        init = ROOT / pkg / "__init__.py"
        text = f'"""{doc}"""\n'
        if not init.exists() or init.read_text(encoding="utf-8") != text:
            init.parent.mkdir(exist_ok=True)
            init.write_text(text, encoding="utf-8")
            git("add", str(init.relative_to(ROOT)))
            done.append(f"wrote {pkg}/__init__.py")
    return done


def _alternation(names: dict[str, str]) -> str:
    """A regex alternation of the names, longest first."""
    return "|".join(sorted((re.escape(n) for n in names), key=len, reverse=True))


def build_rewriters() -> list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]]:
    rules: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = []
    for (package, folder), table in MOVES.items():
        names = _alternation(table)
        # Dotted: gpufed.hub.store(.X)? anywhere (imports, strings, TOML, prose).
        dotted = re.compile(rf"(?<![\w.]){re.escape(package)}\.({names})\b(?![\w-])")
        rules.append((dotted, partial(_moved, f"{package}.{{sub}}.{{name}}", table)))
        # Paths from the repository root: hub/store.py, but not tests/unit/hub/term.py.
        path = re.compile(rf"(?<![\w/.-]){re.escape(folder)}/({names})\.py\b")
        rules.append((path, partial(_moved, f"{folder}/{{sub}}/{{name}}.py", table)))
        # from gpufed.hub import a, b as c  /  from gpufed.hub import (\n a,\n b,\n)
        frm = re.compile(
            rf"^(?P<indent>[ \t]*)from {re.escape(package)} import "
            rf"(?P<names>\([^)]*\)|[^\n(]*?)(?P<comment>[ \t]*#[^\n]*)?$",
            re.M,
        )
        rules.append((frm, partial(_split_from, package=package, table=table)))
    return rules


def _moved(template: str, table: dict[str, str], m: re.Match[str]) -> str:
    return template.format(sub=table[m.group(1)], name=m.group(1))


def _split_from(m: re.Match[str], package: str, table: dict[str, str]) -> str:
    raw = m.group("names").strip()
    inner = raw[1:-1] if raw.startswith("(") else raw
    items = [re.sub(r"#[^\n]*", "", i).strip() for i in inner.split(",")]
    items = [" ".join(i.split()) for i in items if i.strip()]
    if not any(i.split(" ")[0] in table for i in items):
        return m.group(0)
    groups: dict[str, list[str]] = {}
    for item in items:
        sub = table.get(item.split(" ")[0])
        target = f"{package}.{sub}" if sub else package
        groups.setdefault(target, []).append(item)
    indent, comment = m.group("indent"), m.group("comment") or ""
    lines = [f"{indent}from {t} import {', '.join(i)}" for t, i in groups.items()]
    lines[0] += comment
    return "\n".join(lines)


def tracked_text_files() -> list[Path]:
    files = []
    for rel in git("ls-files", "-z").split("\0"):
        if not rel or GENERATED.match(rel) or rel.startswith("scripts/relayout.py"):
            continue
        p = ROOT / rel
        if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES):
            files.append(p)
    return files


def rewrite_files() -> list[Path]:
    """Step 3. Returns the files it changed."""
    rules = build_rewriters()
    changed = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        new = text
        for pattern, repl in rules:
            new = pattern.sub(repl, new)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


def _insert_after(text: str, pattern: str, line: str, missing: str) -> str:
    """The text with the line after the pattern's first match, unless the line is there."""
    if line in text:
        return text
    m = re.search(pattern, text, re.M)
    if m is None:
        sys.exit(f"relayout: pyproject.toml {missing}")
    return text[: m.end()] + line + text[m.end() :]


def update_pyproject() -> bool:
    """Step 4: the package lists and the new contracts."""
    path = ROOT / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    new = text
    for (package, folder), table in MOVES.items():
        for sub in dict.fromkeys(table.values()):
            name = f"{package}.{sub}"
            # packages = [..., "gpufed.hub", "gpufed.hub.<sub>", ...]: after the last of those.
            line = f'    "{name}",\n'
            listed = rf'^    "{re.escape(package)}",\n(?:    "{re.escape(package)}\.[\w.]+",\n)*'
            new = _insert_after(new, listed, line, f"packages: no line for {package}")
            # package-dir: "gpufed.hub" = "hub", then "gpufed.hub.<sub>" = "hub/<sub>".
            line = f'"{name}" = "{folder}/{sub}"\n'
            mapped = (
                rf'^"{re.escape(package)}" = "{re.escape(folder)}"\n'
                rf'(?:"{re.escape(package)}\.[\w.]+" = "[^"\n]+"\n)*'
            )
            new = _insert_after(new, mapped, line, f"package-dir: no line for {package}")
    for after, name, toml, _ in NEW_CONTRACTS:
        if f'name = "{name}"' in new:
            continue
        anchor = new.find(f'name = "{after}"')
        if anchor < 0:
            sys.exit(f"relayout: pyproject.toml has no contract named {after!r}")
        # At the blank line that ends that contract's table (or at the end of the file).
        cut = new.find("\n\n", anchor)
        cut = len(new.rstrip("\n")) if cut < 0 else cut
        new = new[:cut] + "\n" + toml.rstrip("\n") + new[cut:]
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def edit_files() -> list[Path]:
    """Step 5 for files other than docs/design.md: FILE_EDITS."""
    changed = []
    for rel, old, replacement in FILE_EDITS:
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        if replacement in text:
            continue
        if old not in text:
            print(f"relayout: WARNING {rel}: text not found: {old[:60]!r}")
            continue
        path.write_text(text.replace(old, replacement, 1), encoding="utf-8")
        changed.append(path)
    return changed


def update_design() -> bool:
    """Step 5: docs/design.md §1, §9 and §12."""
    path = ROOT / "docs" / "design.md"
    text = path.read_text(encoding="utf-8")
    new = text
    for anchor, block, marker in DESIGN_INSERTS:
        if marker in new:
            continue
        i = new.find(anchor)
        if i < 0:
            print(f"relayout: WARNING docs/design.md: anchor not found: {anchor[:60]!r}")
            continue
        i += len(anchor)
        new = new[:i] + block + new[i:]
    for old, replacement in DESIGN_EDITS:
        if replacement in new:
            continue
        if old not in new:
            print(f"relayout: WARNING docs/design.md: text not found: {old[:60]!r}")
            continue
        new = new.replace(old, replacement, 1)
    for after, _, _, design_row in NEW_CONTRACTS:
        if design_row in new:
            continue
        row = re.search(rf"^\| {re.escape(after)} \|.*\n", new, re.M)
        if row is None:
            print(f"relayout: WARNING docs/design.md §12: no row {after!r}")
            continue
        new = new[: row.end()] + design_row + "\n" + new[row.end() :]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    count = len(re.findall(r"^\[\[tool\.importlinter\.contracts\]\]", pyproject, re.M))
    new = re.sub(
        r"as the \w+ import-linter contracts",
        f"as the {NUMBERS[count]} import-linter contracts",
        new,
    )
    if new != text:
        path.write_text(new, encoding="utf-8")
        return True
    return False


def tool(name: str) -> str | None:
    venv = ROOT / ".venv" / "bin" / name
    return str(venv) if venv.exists() else shutil.which(name)


def run_tools(changed: list[Path]) -> None:
    """Step 6: regenerate the CRDs; re-sort and re-format the Python files changed."""
    python = tool("python")
    if python is None:
        print("relayout: WARNING no python with gpufed installed: run `make crds`")
    else:
        subprocess.run([python, "scripts/gen_crds.py"], cwd=ROOT, check=True)
    py = [str(p.relative_to(ROOT)) for p in changed if p.suffix in {".py", ".pyi"} and p.exists()]
    py += [f"{pkg}/__init__.py" for pkg in DOCSTRINGS]
    ruff = tool("ruff")
    if ruff is None:
        print("relayout: WARNING ruff not found: run `make fmt`")
        return
    if py:
        subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *py], cwd=ROOT, check=False)
        subprocess.run([ruff, "format", "-q", *py], cwd=ROOT, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-tools", action="store_true", help="skip gen_crds and ruff (step 6)")
    args = parser.parse_args()
    check_table()
    moved = move_modules()
    changed = rewrite_files()
    if update_pyproject():
        changed.append(ROOT / "pyproject.toml")
    if update_design():
        changed.append(ROOT / "docs" / "design.md")
    changed += edit_files()
    if not args.no_tools:
        run_tools(changed)
    for line in moved:
        print(line)
    print(f"relayout: {len(moved)} moves/inits, {len(set(changed))} files rewritten")


if __name__ == "__main__":
    main()

"""docs/design.md §12 lists the import contracts pyproject.toml declares, and nothing else: the
same names in the same order, the same source modules and the same forbidden imports (short
names in the page stand for ``gpufed.<name>``), and the same indirect-import rule; for a
``layers`` contract, the same container and the same layers in the same order."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
#: How §12's first sentence counts the contracts.
NUMBERS = [
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
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
]
COMPONENTS = frozenset({"api", "placement", "sync", "hub", "agent", "sandbox", "console", "cli"})
_TICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Row:
    """One row of the §12 table."""

    name: str
    source: str
    forbidden: frozenset[str]
    indirect_allowed: bool
    #: The ticked names of the third cell in order: a ``layers`` contract's layers.
    listed: tuple[str, ...] = ()


def section(text: str, number: int) -> str:
    """The text of ``## <number>.`` up to the next ``## `` heading."""
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"docs/design.md has no section {number}"
    return match.group(0)


def design_rows(text: str) -> list[Row]:
    """The rows of the first table of §12 (after its header and separator)."""
    rows: list[Row] = []
    lines = [line for line in section(text, 12).splitlines() if line.startswith("|")]
    assert lines[0].startswith("| contract |"), lines[0]
    for line in lines[2:]:
        name, source, forbids = (cell.strip() for cell in line.strip("|").split(" | "))
        listed = forbids.split(" (", 1)[0]
        rows.append(
            Row(
                name=name.replace("`", ""),
                source=source,
                forbidden=frozenset(
                    f"gpufed.{m}" if m in COMPONENTS else m for m in _TICKED.findall(listed)
                ),
                indirect_allowed="indirect imports allowed" in forbids
                or "direct imports only" in forbids,
                listed=tuple(_TICKED.findall(listed)),
            )
        )
    return rows


def declared() -> list[dict[str, Any]]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        contracts: list[dict[str, Any]] = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return contracts


def agent_modules() -> set[str]:
    return {
        f"gpufed.agent.{p.stem}"
        for p in (ROOT / "member-agent").glob("*.py")
        if p.stem != "__init__"
    }


def test_the_design_lists_every_contract_of_pyproject_by_name_in_order() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    assert [r.name for r in design_rows(text)] == [c["name"] for c in declared()]
    count = re.search(r"as the (\w+) import-linter contracts", section(text, 12))
    assert count is not None
    assert count.group(1) == NUMBERS[len(declared())]


@pytest.mark.parametrize("contract", declared(), ids=lambda c: c["name"])
def test_each_contract_row_says_what_pyproject_declares(contract: dict[str, Any]) -> None:
    rows = design_rows(DESIGN.read_text(encoding="utf-8"))
    row = next(r for r in rows if r.name == contract["name"])
    if contract["type"] == "layers":
        # "`gpufed.hub` | `edge`, `components`, ...: a layer imports only the layers after it"
        assert {row.source.strip("`")} == set(contract["containers"])
        assert list(row.listed) == contract["layers"]
        return
    sources = set(contract["source_modules"])
    if row.source.startswith("every other"):
        # "every other `gpufed.agent` module (listed)": all of the package but the one named
        # in the contract's name.
        (excepted,) = re.findall(r"gpufed\.agent\.\w+", row.name)
        assert sources == agent_modules() - {excepted}
    else:
        assert {row.source.strip("`")} == sources
    assert row.forbidden == frozenset(contract["forbidden_modules"])
    assert row.indirect_allowed == bool(contract.get("allow_indirect_imports", False))


def test_the_parser_reads_a_row_as_meant() -> None:
    """The checks above can fail: a row that forbids one module less reads differently."""
    text = (
        "## 12. Arrows\n\n| contract | source | must not import |\n|---|---|---|\n"
        "| sync imports api only | `gpufed.sync` | `placement`, `hub` (and `x`) |\n"
    )
    (row,) = design_rows(text)
    assert row == Row(
        "sync imports api only",
        "`gpufed.sync`",
        frozenset({"gpufed.placement", "gpufed.hub"}),
        indirect_allowed=False,
        listed=("placement", "hub"),
    )

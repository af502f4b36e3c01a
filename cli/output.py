"""How every ``gpufed get`` command prints: ``-o wide|json|yaml|name``, ``-l`` label selectors
and ``-w/--watch``, shared by ``get jobs|clusters|queues|gpus`` (one module, one behaviour).

A command describes its rows once (:class:`Listing`: the API list to read, the rows built from
the objects, the table's columns, each row's key and name) and hands it to :func:`show`.

Output formats (``-o``):

- default: a table of the non-wide columns; ``wide``: every column;
- ``json``: one JSON array of the rows, exactly the shape ``--json`` always printed (``--json``
  stays as an alias of ``-o json``); ``yaml``: the same array as YAML;
- ``name``: one ``<resource>/<name>`` per row (``gpujob.gpufed.io/train``), as kubectl prints.

Label selectors (``-l``, kubectl syntax): ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
``k notin (a,b)``, ``k`` (exists), ``!k`` (does not exist), comma-separated and ANDed. Parsed
and checked here first (a bad one is one error line naming ``-l`` and the fix), then passed to
the API server's ``labelSelector`` where the labels live in ``metadata.labels`` (GPUJobs,
GPUQueues); MemberClusters are matched here against their ``spec.labels`` (the labels
placement's ``clusterSelector`` reads), with ``metadata.labels`` under them.

Watch (``-w``): lists, prints the rows, then follows a watch from the list's resourceVersion and
prints a row again each time its data changes (not when only its AGE moved on; a deleted
object's row is printed a last time; columns keep the first table's widths); ``-o json|yaml`` print one ``{"type": ADDED|MODIFIED|DELETED, "object": row}``
document per change. Bounded: each watch request ends after :data:`WATCH_REQUEST_S` seconds and
is resumed from the last resourceVersion (a 410 Gone relists); memory is one object per listed
object. Ends on Ctrl-C (exit code 0) or after ``--watch-timeout`` seconds.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

import typer
import yaml

from gpufed.api.errors import PermanentError

__all__ = [
    "FORMATS",
    "WATCH_REQUEST_S",
    "AsJSON",
    "Column",
    "Listing",
    "Output",
    "Requirement",
    "Selector",
    "SelectorError",
    "Watch",
    "WatchTimeout",
    "output_format",
    "parse_selector",
    "render",
    "show",
]

Format = Literal["table", "wide", "json", "yaml", "name"]
FORMATS: Final = ("wide", "json", "yaml", "name")
#: Seconds one watch request stays open before it is resumed (the server's timeoutSeconds).
WATCH_REQUEST_S: Final = 300
#: Longest selector accepted (characters) and most requirements in one.
MAX_SELECTOR_CHARS: Final = 4096
MAX_REQUIREMENTS: Final = 64

Output = Annotated[
    str | None,
    typer.Option("--output", "-o", help="wide, json, yaml or name (default: a table)"),
]
AsJSON = Annotated[bool, typer.Option("--json", help="print JSON (the same as -o json)")]
SelectorOption = Annotated[
    str | None,
    typer.Option(
        "--selector",
        "-l",
        help="label selector, kubectl syntax: k=v, k!=v, 'k in (a,b)', 'k notin (a)', k, !k",
    ),
]
Watch = Annotated[
    bool, typer.Option("--watch", "-w", help="after listing, print rows as they change")
]
WatchTimeout = Annotated[
    float,
    typer.Option("--watch-timeout", min=0, help="with -w: stop after this many seconds (0: never)"),
]


def output_format(output: str | None, as_json: bool) -> Format:
    """The format of ``-o`` (None: the table) and ``--json``; raises ``typer.BadParameter``."""
    if output is None:
        return "json" if as_json else "table"
    if output not in FORMATS:
        raise typer.BadParameter(
            f"{output!r} is not one of {', '.join(FORMATS)}", param_hint="'-o' / '--output'"
        )
    if as_json and output != "json":
        raise typer.BadParameter(f"--json and -o {output} disagree: use one", param_hint="--json")
    fmt: Format = output  # type: ignore[assignment]  # checked against FORMATS above
    return fmt


# --- label selectors ------------------------------------------------------------------------------


class SelectorError(PermanentError, ValueError):
    """A label selector that does not parse; the message names ``-l`` and the expected form."""


_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


@dataclass(frozen=True)
class Requirement:
    """One requirement: ``key`` ``op`` (``=``, ``!=``, ``in``, ``notin``, ``exists``,
    ``!``) ``values``."""

    key: str
    op: Literal["=", "!=", "in", "notin", "exists", "!"]
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement (Kubernetes semantics: ``!=`` and
        ``notin`` hold for an absent key)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values

    def text(self) -> str:
        """The requirement in the canonical kubectl form (what the API server is sent)."""
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


@dataclass(frozen=True)
class Selector:
    """Requirements ANDed; empty matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether every requirement holds on ``labels``."""
        return all(r.matches(labels) for r in self.requirements)

    def text(self) -> str:
        """The canonical selector string ("" when empty), for ``labelSelector``."""
        return ",".join(r.text() for r in self.requirements)


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"-l {text!r}: a ')' without its '('")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise SelectorError(f"-l {text!r}: a '(' without its ')'")
    parts.append(text[start:])
    return parts


_SET = re.compile(r"^(?P<key>\S+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ = re.compile(r"^(?P<key>[^=!\s]+)\s*(?P<op>==|=|!=)\s*(?P<value>\S*)$")


def parse_selector(text: str | None) -> Selector:
    """Parse a kubectl label selector (module doc); ``None`` or blank: match everything.

    Raises :class:`SelectorError` naming ``-l``, the bad part and the accepted forms: past
    :data:`MAX_SELECTOR_CHARS` characters or :data:`MAX_REQUIREMENTS` requirements, an
    invalid label key or value, an unknown operator.
    """
    if text is None or not text.strip():
        return Selector()
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"-l: longer than {MAX_SELECTOR_CHARS} characters")
    forms = "k=v, k==v, k!=v, 'k in (a,b)', 'k notin (a,b)', k, !k"
    reqs: list[Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise SelectorError(f"-l {text!r}: an empty requirement (a stray comma?)")
        req: Requirement
        if m := _SET.match(part):
            values = tuple(v.strip() for v in m["values"].split(",") if v.strip())
            if not values:
                raise SelectorError(f"-l: {part!r} lists no values (write k {m['op']} (a,b))")
            req = Requirement(m["key"], m["op"], values)  # type: ignore[arg-type]
        elif m := _EQ.match(part):
            op = "=" if m["op"] == "==" else m["op"]
            req = Requirement(m["key"], op, (m["value"],))  # type: ignore[arg-type]
        elif part.startswith("!"):
            req = Requirement(part[1:].strip(), "!")
        elif re.fullmatch(r"\S+", part):
            req = Requirement(part, "exists")
        else:
            raise SelectorError(f"-l: {part!r} is not a requirement (use {forms})")
        if not _KEY.match(req.key) or len(req.key) > 317:
            raise SelectorError(
                f"-l: {req.key!r} is not a label key ([prefix/]name, name up to 63 characters "
                "of letters, digits, '-', '_', '.')"
            )
        for v in req.values:
            if not _VALUE.match(v):
                raise SelectorError(
                    f"-l: {v!r} (key {req.key}) is not a label value (up to 63 letters, digits, "
                    "'-', '_', '.', alphanumeric at both ends)"
                )
        reqs.append(req)
        if len(reqs) > MAX_REQUIREMENTS:
            raise SelectorError(f"-l: more than {MAX_REQUIREMENTS} requirements")
    return Selector(tuple(reqs))


# --- rows and rendering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """A table column: ``header``, the cell text of a row (``cell``), shown only with
    ``-o wide`` when ``wide``."""

    header: str
    cell: Callable[[Mapping[str, Any]], str]
    wide: bool = False


def table_lines(rows: Sequence[Sequence[str]], min_widths: Sequence[int] = ()) -> list[str]:
    """Left-aligned columns three spaces apart, trailing blanks stripped (kubectl's layout);
    column ``i`` at least ``min_widths[i]`` wide (a watch keeps its first table's columns)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths = [max(w, m) for w, m in zip(widths, [*min_widths, *[0] * len(widths)], strict=False)]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column],
    fmt: Format,
    *,
    name_of: Callable[[Mapping[str, Any]], str],
    resource: str,
    header: bool = True,
    min_widths: Sequence[int] = (),
) -> str:
    """``rows`` in ``fmt`` (module doc), without a trailing newline.

    ``name_of``: a row's name for ``-o name`` (printed as ``<resource>/<name>``); ``header``:
    whether tables print their header line (a watch prints it once); ``min_widths``: the least
    width of each table column.
    """
    if fmt == "json":
        return json.dumps(list(rows))
    if fmt == "yaml":
        return yaml.safe_dump(list(rows), sort_keys=False).rstrip("\n")
    if fmt == "name":
        return "\n".join(f"{resource}/{name_of(r)}" for r in rows)
    cols = [c for c in columns if fmt == "wide" or not c.wide]
    table = [[c.header for c in cols], *([c.cell(r) for c in cols] for r in rows)]
    lines = table_lines(table, min_widths)
    return "\n".join(lines if header else lines[1:])


# --- listing and watching -------------------------------------------------------------------------


@dataclass
class Listing:
    """What one ``get`` command lists and how its rows print.

    ``list_objects(label_selector)``: the API list (a dict with ``items`` and
    ``metadata.resourceVersion``), ``label_selector`` the canonical string or "" (ignored when
    ``server_side_selector`` is False); ``watch_objects(resource_version, label_selector,
    timeout_s)``: the watch events (``{"type", "object"}``) from that version; ``rows(objs)``:
    the printed rows of the (selected) objects; ``key_of``: a row's identity across changes;
    ``labels_of``: an object's labels for a selector matched here (when not server-side);
    ``empty``: the line printed for no rows in the table formats.
    """

    resource: str
    columns: Sequence[Column]
    rows: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    list_objects: Callable[[str], Mapping[str, Any]]
    watch_objects: Callable[[str, str, int], Iterable[Mapping[str, Any]]]
    empty: str
    key_of: Callable[[Mapping[str, Any]], str] = lambda r: str(r["name"])
    name_of: Callable[[Mapping[str, Any]], str] = lambda r: str(r["name"])
    server_side_selector: bool = True
    labels_of: Callable[[Mapping[str, Any]], Mapping[str, str]] = lambda o: (
        (o.get("metadata") or {}).get("labels") or {}
    )
    clock: Callable[[], float] = field(default=time.monotonic)


def _obj_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def show(
    listing: Listing,
    fmt: Format,
    selector: Selector,
    *,
    watch: bool = False,
    watch_timeout_s: float = 0.0,
    echo: Callable[[str], None] = typer.echo,
) -> None:
    """List, print, and with ``watch`` follow changes (module doc). API errors propagate."""
    sel = selector.text()
    resp = listing.list_objects(sel if listing.server_side_selector else "")
    objects = {_obj_key(o): o for o in resp.get("items") or [] if _selected(listing, selector, o)}
    rows = listing.rows(list(objects.values()))
    if not watch:
        if not rows and fmt in ("table", "wide"):
            echo(listing.empty)
        elif rows or fmt in ("json", "yaml"):
            echo(_render(listing, rows, fmt))
        return
    if fmt in ("json", "yaml"):
        for r in rows:
            echo(_event_doc("ADDED", r, fmt))
    elif rows:
        echo(_render(listing, rows, fmt))
    elif fmt in ("table", "wide"):
        echo(listing.empty)
    # what was printed per row, as data: a row prints again when its data changes, not when
    # a rendered cell drifts by itself (AGE)
    printed: dict[str, Mapping[str, Any]] = {listing.key_of(r): r for r in rows}
    widths = _widths(listing, rows, fmt)
    version = str((resp.get("metadata") or {}).get("resourceVersion") or "")
    deadline = listing.clock() + watch_timeout_s if watch_timeout_s else None
    try:
        for before in _follow(listing, selector, objects, version, deadline):
            new_rows = {listing.key_of(r): r for r in listing.rows(list(objects.values()))}
            for key, row, etype in _changes(printed, new_rows, before):
                if fmt in ("json", "yaml"):
                    echo(_event_doc(etype, row, fmt))
                else:
                    echo(_render(listing, [row], fmt, header=False, min_widths=widths))
                if etype == "DELETED":
                    printed.pop(key, None)
                else:
                    printed[key] = row
    except KeyboardInterrupt:
        return


def _render(
    listing: Listing,
    rows: Sequence[Mapping[str, Any]],
    fmt: Format,
    header: bool = True,
    min_widths: Sequence[int] = (),
) -> str:
    return render(
        rows,
        listing.columns,
        fmt,
        name_of=listing.name_of,
        resource=listing.resource,
        header=header,
        min_widths=min_widths,
    )


def _widths(listing: Listing, rows: Sequence[Mapping[str, Any]], fmt: Format) -> list[int]:
    """Column widths of the first table (header and listed rows)."""
    cols = [c for c in listing.columns if fmt == "wide" or not c.wide]
    return [max([len(c.header), *(len(c.cell(r)) for r in rows)]) for c in cols]


def _event_doc(etype: str, row: Mapping[str, Any], fmt: Format) -> str:
    doc = {"type": etype, "object": dict(row)}
    if fmt == "json":
        return json.dumps(doc)
    return "---\n" + yaml.safe_dump(doc, sort_keys=False).rstrip("\n")


def _changes(
    printed: dict[str, Mapping[str, Any]],
    new_rows: dict[str, dict[str, Any]],
    old_rows: dict[str, dict[str, Any]],
) -> Iterator[tuple[str, Mapping[str, Any], str]]:
    """(key, row, ADDED|MODIFIED|DELETED) for every row whose data changed since printed."""
    for key, row in new_rows.items():
        if printed.get(key) != row:
            yield key, row, "MODIFIED" if key in printed else "ADDED"
    for key in [k for k in printed if k not in new_rows]:
        old = old_rows.get(key)
        if old is not None:
            yield key, old, "DELETED"
        else:
            printed.pop(key, None)


def _selected(listing: Listing, selector: Selector, obj: Mapping[str, Any]) -> bool:
    return listing.server_side_selector or selector.matches(listing.labels_of(obj))


def _follow(
    listing: Listing,
    selector: Selector,
    objects: dict[str, dict[str, Any]],
    version: str,
    deadline: float | None,
) -> Iterator[dict[str, dict[str, Any]]]:
    """Apply watch events to ``objects`` in place; yields after each change the rows as they
    were just before it (so a deleted row can be printed a last time)."""
    sel = selector.text() if listing.server_side_selector else ""
    while deadline is None or listing.clock() < deadline:
        left = WATCH_REQUEST_S if deadline is None else max(1, int(deadline - listing.clock()))
        try:
            for event in listing.watch_objects(version, sel, min(WATCH_REQUEST_S, left)):
                etype, obj = str(event.get("type")), event.get("object") or {}
                meta = obj.get("metadata") or {}
                version = str(meta.get("resourceVersion") or version)
                if etype == "BOOKMARK":
                    continue
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise _GoneError
                    continue
                before = {listing.key_of(r): r for r in listing.rows(list(objects.values()))}
                key = _obj_key(obj)
                if etype == "DELETED" or not _selected(listing, selector, obj):
                    if objects.pop(key, None) is None:
                        continue
                else:
                    objects[key] = obj
                yield before
                if deadline is not None and listing.clock() >= deadline:
                    return
        except _GoneError:
            before = {listing.key_of(r): r for r in listing.rows(list(objects.values()))}
            resp = listing.list_objects(sel)
            objects.clear()
            objects.update(
                {_obj_key(o): o for o in resp.get("items") or [] if _selected(listing, selector, o)}
            )
            version = str((resp.get("metadata") or {}).get("resourceVersion") or "")
            yield before


class _GoneError(Exception):
    """The watch's resourceVersion is too old (410): list again."""

"""Fleet-spec validation: the error that names every offending field, and the cross-field checks.

:class:`FleetError` (a ``ValueError``) lists every problem of a fleet as a :class:`FleetIssue`
with a path such as ``clusters[2].nodePools[0].mig.profiles``; pydantic's errors are turned into
those paths here (``_issues_from``), and the checks the models' validators share (DNS-label
names, label values, GPU product spellings, MIG layouts against the GPU catalogue) live here
too. Split out of :mod:`gpufed.api.fleet`, which re-exports :class:`FleetError` and
:class:`FleetIssue`; only the fleet models call the checks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpufed.api.errors import PermanentError
from gpufed.api.gpus import KNOWN_GPUS

if TYPE_CHECKING:
    from gpufed.api.fleet import GPUSpec, MigSpec

# GFD's sanitise(): characters outside [A-Za-z0-9-_. ] are dropped and blanks become "-", so a
# product label value never contains a space; it is also a label value (<= 63 characters).
_PRODUCT_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?)?$")
_MAX_LABEL_VALUE = 63


# --- errors -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetIssue:
    """One problem in a fleet: ``path`` like ``clusters[0].nodePools[1].gpu.count``."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class FleetError(PermanentError, ValueError):
    """An invalid fleet spec. ``issues`` lists every problem; the message shows them all,
    prefixed by the file name when the fleet was loaded from a file."""

    def __init__(self, issues: list[FleetIssue], source: str | None = None) -> None:
        self.issues = issues
        self.source = source
        head = f"invalid fleet file {source}" if source else "invalid fleet spec"
        lines = "\n".join(f"  - {i}" for i in issues)
        super().__init__(f"{head}:\n{lines}")


class _IssuesError(ValueError):
    """Raised inside validators: issues with paths relative to the model being validated."""

    def __init__(self, issues: list[FleetIssue]) -> None:
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))


# --- checks -----------------------------------------------------------------------------------------


def _check_dns_label(v: str, what: str) -> str:
    if len(v) > _MAX_LABEL_VALUE or not _DNS_LABEL_RE.match(v):
        raise ValueError(
            f"{v!r} is not a valid {what} name: use lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (a DNS label, <= 63 characters)"
        )
    return v


def _mig_issues(mig: MigSpec, gpu: GPUSpec) -> list[FleetIssue]:
    model = gpu.known
    if model is None or not model.mig_profiles:
        capable = [p for p, m in KNOWN_GPUS.items() if m.mig_profiles]
        why = "is not MIG-capable" if model is not None else "has no known MIG profiles"
        return [
            FleetIssue(
                "mig",
                f"{gpu.product} {why}; remove mig, or use a MIG-capable product "
                f"({', '.join(capable)})",
            )
        ]
    issues: list[FleetIssue] = []
    unknown = [p for p in mig.profiles if p not in model.mig_profiles]
    if unknown:
        issues.append(
            FleetIssue(
                "mig.profiles",
                f"{', '.join(unknown)} not a MIG profile of {gpu.product}; its profiles are "
                f"{', '.join(model.mig_profiles)}",
            )
        )
        return issues
    if mig.strategy == "single":
        if len(mig.profiles) != 1:
            issues.append(
                FleetIssue(
                    "mig.profiles",
                    "the single strategy splits every GPU into one profile; give exactly one "
                    "(or use strategy: mixed)",
                )
            )
        if mig.gpus is not None and mig.gpus != gpu.count:
            issues.append(
                FleetIssue(
                    "mig.gpus",
                    f"{mig.gpus}: the single strategy partitions all {gpu.count} GPUs; drop "
                    "mig.gpus or use strategy: mixed",
                )
            )
    elif mig.gpus is not None and not 1 <= mig.gpus <= gpu.count:
        issues.append(
            FleetIssue(
                "mig.gpus",
                f"{mig.gpus} partitioned GPUs per node, but nodes have {gpu.count}; use 1..{gpu.count}",
            )
        )
    compute = memory = 0
    for name, n in mig.profiles.items():
        shape = model.mig_profiles[name]
        compute += shape.compute_slices * n
        memory += shape.memory_slices * n
        if n > shape.max_per_gpu:
            issues.append(
                FleetIssue(
                    f"mig.profiles.{name}",
                    f"{n} instances exceed one {gpu.product}: at most {shape.max_per_gpu} "
                    f"{name} per GPU",
                )
            )
    if not issues and (compute > model.compute_slices or memory > model.memory_slices):
        issues.append(
            FleetIssue(
                "mig.profiles",
                f"{dict(mig.profiles)} does not fit one {gpu.product}: it needs {compute} of "
                f"{model.compute_slices} compute slices and {memory} of {model.memory_slices} "
                "memory slices per GPU; use fewer instances (e.g. 2 x 1g + 1 x 2g + 1 x 3g)",
            )
        )
    return issues


def _loc_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _issues_from(exc: ValidationError) -> list[FleetIssue]:
    issues: list[FleetIssue] = []
    for err in exc.errors():
        base = _loc_path(err["loc"])
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, _IssuesError):
            for i in inner.issues:
                path = f"{base}.{i.path}" if base and i.path else base or i.path
                issues.append(FleetIssue(path, i.message))
            continue
        kind = err["type"]
        msg = err["msg"].removeprefix("Value error, ")
        if kind == "extra_forbidden":
            msg = (
                "unknown field; fields are camelCase (docs/design.md §5: nodePools, memoryMiB, "
                "nodesPerDomain, rackSize, racksPerBlock); check the spelling"
            )
        elif kind == "missing":
            msg = "required field is missing"
        issues.append(FleetIssue(base, msg))
    return issues

"""An independent reference of gpufed's quota arithmetic, for model-based tests.

Written from docs/placement.md ("Quota arithmetic") without the product's code: plain dicts of
queue specs and a list of charged jobs, every sum recomputed from the jobs by walking parent
links (no ledger, no caches, no :mod:`gpufed.placement.quota`). Whole GPUs only (no MIG).

- ``entry(n, k)``: the key of ``n``'s quota entry that concrete product ``k`` resolves to;
- ``used(n, k)``: GPUs of the jobs counted in that pool (broken queues below ``n`` included);
- ``cap(n, k)``: nominal at a root, nominal + borrowingLimit elsewhere, else no limit;
- ``load(n, k) = used + X``, ``X(n) = Σ Y(child)``, ``Y(c) = max(X(c), nominal - lending -
  used, 0)`` for an entry with a lending limit, else ``X(c)``; valid when ``load <= cap``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INF = float("inf")
ANY = "*"


@dataclass
class Entry:
    nominal: int
    borrowing: int | None = None
    lending: int | None = None


@dataclass
class Spec:
    parent: str | None
    quotas: dict[str, Entry] = field(default_factory=dict)
    namespaces: tuple[str, ...] = ()


@dataclass(frozen=True)
class Job:
    uid: str
    queue: str
    key: str
    gpus: int


class Reference:
    """The arithmetic over ``specs`` (no parent cycles) and ``jobs``; ``default`` is the
    queue unqueued work goes to (unlimited unless a spec of that name exists)."""

    def __init__(self, specs: dict[str, Spec], jobs: list[Job], default: str = "default"):
        self.specs = dict(specs)
        if default not in self.specs:
            self.specs[default] = Spec(None)
        self.jobs = jobs
        self.broken = self._broken()

    def _broken(self) -> set[str]:
        owners: dict[str, list[str]] = {}
        for name, s in self.specs.items():
            for ns in s.namespaces:
                owners.setdefault(ns, []).append(name)
        out = {n for names in owners.values() if len(names) > 1 for n in names}
        changed = True
        while changed:
            changed = False
            for name, s in self.specs.items():
                if (
                    name not in out
                    and s.parent is not None
                    and (s.parent in out or s.parent not in self.specs)
                ):
                    out.add(name)
                    changed = True
        return out

    def accepted(self) -> list[str]:
        return sorted(n for n in self.specs if n not in self.broken)

    def children(self, name: str) -> list[str]:
        return sorted(c for c, s in self.specs.items() if s.parent == name and c not in self.broken)

    def _below(self, queue: str, name: str) -> bool:
        """``queue`` is ``name`` or under it by parent links (broken queues too)."""
        cur: str | None = queue
        while cur is not None:
            if cur == name:
                return True
            cur = self.specs[cur].parent if cur in self.specs else None
        return False

    def _nearest_accepted(self, queue: str) -> str | None:
        cur: str | None = queue
        while cur is not None and cur in self.broken:
            cur = self.specs[cur].parent if cur in self.specs else None
        return cur

    def entry(self, name: str, key: str) -> str | None:
        q = self.specs[name].quotas
        if key in q:
            return key
        return ANY if ANY in q else None

    def nominal(self, name: str, key: str) -> float:
        e = self.entry(name, key)
        if e is not None:
            return self.specs[name].quotas[e].nominal
        ch = self.children(name)
        if ch:
            return sum(self.nominal(c, key) for c in ch)
        return 0 if self.specs[name].quotas else INF

    def pool(self, name: str, key: str) -> list[Job]:
        """The jobs counted in ``name``'s pool for ``key``."""
        e = self.entry(name, key)
        if e is not None:
            return [
                j for j in self.jobs if self._below(j.queue, name) and self.entry(name, j.key) == e
            ]
        own = [
            j
            for j in self.jobs
            if j.key == key and (j.queue == name or self._nearest_accepted(j.queue) == name)
        ]
        return own + [j for c in self.children(name) for j in self.pool(c, key)]

    def used(self, name: str, key: str) -> int:
        return sum(j.gpus for j in self.pool(name, key))

    def cap(self, name: str, key: str) -> float:
        s = self.specs[name]
        if s.parent is None:
            return self.nominal(name, key)
        e = self.entry(name, key)
        if e is None or s.quotas[e].borrowing is None:
            return INF
        return self.nominal(name, key) + s.quotas[e].borrowing  # type: ignore[operator]

    def kept(self, name: str, key: str) -> float:
        """X(name): what the subtrees below ``name`` keep back beyond their usage."""
        return sum(self._y(c, key) for c in self.children(name))

    def _y(self, name: str, key: str) -> float:
        x = self.kept(name, key)
        e = self.entry(name, key)
        if e is not None and self.specs[name].quotas[e].lending is not None:
            ent = self.specs[name].quotas[e]
            x = max(x, ent.nominal - ent.lending - self.used(name, key), 0)  # type: ignore[operator]
        return x

    def load(self, name: str, key: str) -> float:
        return self.used(name, key) + self.kept(name, key)

    def guaranteed(self, name: str, key: str) -> float:
        n = self.nominal(name, key)
        return 0 if n == INF else n

    def violations(self, keys: tuple[str, ...]) -> list[str]:
        """Every (queue, key) whose load is above its cap."""
        out = []
        for n in self.accepted():
            for k in keys:
                load, cap = self.load(n, k), self.cap(n, k)
                if load > cap:
                    out.append(f"{n} {k}: load {load} > cap {cap}")
        return out

    def path(self, queue: str) -> list[str]:
        out = []
        cur: str | None = queue
        while cur is not None:
            out.append(cur)
            cur = self.specs[cur].parent
        return out

"""The console's web server: four read-only pages at stable paths, rendered by the server and
kept live by a small script (aiohttp + Jinja2, no build step).

Pages (GET only, besides ``POST /login`` and ``POST /logout``; any other method answers 405):

* ``/``: the fleet: each member's state, GPU products, GPUs used / reserved / free and the
  largest free NVLink block (:func:`gpufed.console.views.fleet`);
* ``/queues``: the GPUQueue tree with quotas, usage and borrowing, and each queue's fair share
  over the last day as the console sampled it (:class:`ShareHistory`, once a minute);
* ``/jobs``: GPUJobs of every phase, newest first, with ``?namespace=&queue=&phase=`` filters
  (at most :data:`MAX_ROWS` rows; a note says how many more matched);
* ``/jobs/<namespace>/<name>``: one job: its timeline, its conditions, its Events and "why
  pending" as ``gpufed explain`` gives it;
* ``/healthz``: ``ok``.

Every page is complete HTML without JavaScript. ``static/console.js`` re-fetches the page every
``refresh_s`` seconds with the header ``X-Console-Live: 1`` and swaps in the part that changes
(the server then renders only the template's ``live`` block). Reads go through
:class:`gpufed.console.reader.HubReader`, with the identity of whoever started the console:
what it may not read is left out and named at the foot of the page.

Served on loopback by default; there the server answers only requests whose ``Host`` is a
loopback name (a web page elsewhere cannot reach it through DNS rebinding).

Served for many people (``gpufed console --identity caller``, the hub chart's ``console``
value), the reads go out with each caller's own token instead
(:class:`gpufed.console.callers.CallerReaders`): ``Authorization: Bearer`` from an
authenticating proxy, or the cookie ``POST /login`` sets from a pasted token; without one, every
page answers 401 with the login form. ``POST /logout`` drops the cookie.

Who calls it: ``gpufed console`` (``cli/console.py``) and the console tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import jinja2
from aiohttp import web

from gpufed.console import views
from gpufed.console.callers import COOKIE, CallerReaders, TokenRefused, clean_token
from gpufed.console.reader import Hidden, HubReader, HubReadError

__all__ = ["MAX_ROWS", "make_app"]

#: Most job rows one ``/jobs`` page shows.
MAX_ROWS = 500
#: Fair-share history: one sample a minute for a day, for at most this many queues.
SHARE_EVERY_S = 60.0
SHARE_SAMPLES = 1440
SHARE_QUEUES = 500
_HERE = Path(__file__).resolve().parent
_LIVE_HEADER = "X-Console-Live"
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; style-src-attr 'unsafe-inline'; script-src 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Explain = Callable[[dict[str, Any]], str]
#: How long the login cookie lasts (seconds); the token's own expiry ends it sooner.
COOKIE_MAX_AGE_S = 8 * 3600


class _NeedsLogin(Exception):  # noqa: N818 - control flow to the login page
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class ShareHistory:
    """Each queue's fair share over the last day: the hub's ``status.fairShareHistory`` (one
    sample per 15 minutes, kept across hub restarts), then what the console saw since the hub's
    last sample: at most :data:`SHARE_SAMPLES` samples per queue, :data:`SHARE_QUEUES` queues,
    one sample per queue per :data:`SHARE_EVERY_S` at most."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._hub: dict[str, list[tuple[float, float]]] = {}

    def note(self, queues: Iterable[Mapping[str, Any]]) -> None:
        now = self._clock()
        for q in queues:
            name = (q.get("metadata") or {}).get("name", "")
            hub = _hub_samples((q.get("status") or {}).get("fairShareHistory"))
            if hub and (name in self._hub or len(self._hub) < SHARE_QUEUES):
                self._hub[name] = hub
            raw = (q.get("status") or {}).get("fairShare")
            if raw is None:
                continue
            try:
                value = float(raw)
            except (TypeError, ValueError):
                continue
            line = self._samples.get(name)
            if line is None:
                if len(self._samples) >= SHARE_QUEUES:
                    continue
                line = self._samples[name] = deque(maxlen=SHARE_SAMPLES)
            if line and now - line[-1][0] < SHARE_EVERY_S:
                line[-1] = (line[-1][0], value)  # keep the latest value of this minute
            else:
                line.append((now, value))

    def of(self, name: str) -> list[tuple[float, float]]:
        hub = self._hub.get(name, [])
        since = hub[-1][0] if hub else float("-inf")
        return [*hub, *(s for s in self._samples.get(name, ()) if s[0] > since)]


def _hub_samples(raw: Any) -> list[tuple[float, float]]:
    """``status.fairShareHistory`` as (epoch seconds, value), the unreadable samples left out."""
    out: list[tuple[float, float]] = []
    for sample in raw if isinstance(raw, list) else []:
        if not isinstance(sample, Mapping):
            continue
        try:
            when = datetime.fromisoformat(str(sample.get("time", "")).replace("Z", "+00:00"))
            out.append((when.timestamp(), float(sample.get("value", ""))))
        except (TypeError, ValueError):
            continue
    return out[-SHARE_SAMPLES:]


def _loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["pct"] = lambda x: f"{x:.1f}"
    return env


def make_app(
    reader: HubReader | CallerReaders,
    *,
    explain: Explain,
    refresh_s: float = 5.0,
    listen_host: str = "127.0.0.1",
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> web.Application:
    """The aiohttp application. ``reader``: one :class:`HubReader` (every page read as the
    person who started the console) or :class:`CallerReaders` (every request read as its
    caller, see :mod:`gpufed.console.callers`); ``explain(job_object) -> text``: the
    ``gpufed explain`` text (passed in by the CLI, so the console imports no CLI code);
    ``refresh_s``: seconds between live updates in the browser (0: none); ``listen_host``: the
    address served (a loopback one turns on the ``Host`` check)."""
    env = _environment()
    check_host = _loopback(listen_host)
    shares = ShareHistory()
    callers = reader if isinstance(reader, CallerReaders) else None

    @web.middleware
    async def guard(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if check_host and not _loopback(request.url.host or ""):
            return web.Response(status=421, text="the console answers loopback host names only\n")
        resp = await handler(request)
        resp.headers.update(_SECURITY_HEADERS)
        return resp

    async def reader_of(request: web.Request) -> HubReader:
        if callers is None:
            return cast(HubReader, reader)
        try:
            token = clean_token(request.headers.get("Authorization")) or clean_token(
                request.cookies.get(COOKIE)
            )
        except TokenRefused as exc:
            raise _NeedsLogin(str(exc)) from None
        if token is None:
            raise _NeedsLogin("")
        try:
            return await callers.reader(token)
        except TokenRefused as exc:
            raise _NeedsLogin(str(exc)) from None

    def render(
        request: web.Request,
        who: HubReader | None,
        name: str,
        code: int = 200,
        **ctx: Any,
    ) -> web.Response:
        ctx.setdefault("hidden", [])
        ctx.update(
            identity=who.source.describe() if who is not None else "nobody yet",
            server=who.server if who is not None else (callers.server if callers else ""),
            refresh_ms=int(refresh_s * 1000) if who is not None else 0,
            now=now().strftime("%Y-%m-%d %H:%M:%S UTC"),
            path=request.path,
            callers=callers is not None,
        )
        tmpl = env.get_template(name)
        if request.headers.get(_LIVE_HEADER) == "1":
            text = "".join(tmpl.blocks["live"](tmpl.new_context(ctx)))
        else:
            text = tmpl.render(ctx)
        return web.Response(text=text, status=code, content_type="text/html")

    async def namespace_queues(
        who: HubReader,
    ) -> tuple[list[dict[str, Any]], list[Hidden], dict[str, str]]:
        queues = await who.queues()
        shares.note(queues.items)
        mapping = {
            ns: (q.get("metadata") or {}).get("name", "")
            for q in queues.items
            for ns in (q.get("spec") or {}).get("namespaces") or []
        }
        return queues.items, queues.hidden, mapping

    async def fleet_page(request: web.Request, who: HubReader) -> web.Response:
        listed = await who.clusters()
        members = views.fleet(listed.items)
        answers, notes = await who.blocks(m.name for m in members)
        members = views.with_blocks(members, answers)
        return render(
            request,
            who,
            "fleet.html",
            members=members,
            hidden=[*listed.hidden, *notes],
            hub_url=who.hub_url,
        )

    async def queues_page(request: web.Request, who: HubReader) -> web.Response:
        items, hidden, _ = await namespace_queues(who)
        tree = views.queue_tree(items)
        lines = {q.name: views.sparkline(shares.of(q.name)) for q in tree}
        return render(request, who, "queues.html", queues=tree, shares=lines, hidden=hidden)

    async def jobs_page(request: web.Request, who: HubReader) -> web.Response:
        q = request.query
        filters = {k: q.get(k, "").strip() for k in ("namespace", "queue", "phase")}
        if filters["phase"] and filters["phase"] not in views.PHASES:
            raise web.HTTPBadRequest(
                text=f"phase: {filters['phase']!r} is not one of {', '.join(views.PHASES)}\n"
            )
        queue_items, hidden, mapping = await namespace_queues(who)
        listed = await who.jobs(mapping.keys())
        rows = views.job_rows(listed.items, mapping, **filters)
        return render(
            request,
            who,
            "jobs.html",
            rows=rows[:MAX_ROWS],
            more=max(0, len(rows) - MAX_ROWS),
            truncated=listed.truncated,
            filters=filters,
            phases=views.PHASES,
            namespaces=sorted(
                {(j.get("metadata") or {}).get("namespace", "") for j in listed.items}
            ),
            queue_names=sorted((x.get("metadata") or {}).get("name", "") for x in queue_items),
            hidden=[*hidden, *listed.hidden],
            at=now(),
            age=views.age,
        )

    async def job_page(request: web.Request, who: HubReader) -> web.Response:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        read = await who.job(ns, name)
        if read.job is None:
            what = "not found" if read.status == 404 else "not readable with your identity"
            return render(
                request, who, "missing.html", code=read.status, key=f"{ns}/{name}", what=what
            )
        job_status = read.job.get("status") or {}
        return render(
            request,
            who,
            "job.html",
            key=f"{ns}/{name}",
            job=read.job,
            phase=job_status.get("phase") or "Pending",
            status=job_status,
            conditions=job_status.get("conditions") or [],
            events=read.events,
            timeline=views.timeline(read.job, read.events),
            explanation=explain(read.job),
            hidden=read.hidden,
        )

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def login_page(request: web.Request, error: str = "", code: int = 401) -> web.Response:
        return render(request, None, "login.html", code=code, error=error)

    async def login_form(request: web.Request) -> web.Response:
        if callers is None:
            raise web.HTTPNotFound(text="this console reads as whoever started it: no login\n")
        return login_page(request, code=200)

    async def login(request: web.Request) -> web.StreamResponse:
        """``POST /login`` with the form field ``token``: checked with a SelfSubjectReview,
        then kept in an HttpOnly, SameSite=Strict cookie; a cross-site form is refused."""
        if callers is None:
            raise web.HTTPNotFound(text="this console reads as whoever started it: no login\n")
        origin = request.headers.get("Origin")
        forwarded = request.headers.get("X-Forwarded-Proto", request.scheme)
        same = (f"{request.scheme}://{request.host}", f"{forwarded}://{request.host}", "null")
        if request.headers.get("Sec-Fetch-Site") in ("cross-site", "same-site") or (
            origin is not None and origin not in same
        ):
            return web.Response(status=403, text="login from another site is refused\n")
        form = await request.post()
        raw = form.get("token")
        try:
            token = clean_token(raw if isinstance(raw, str) else None)
            if token is None:
                return login_page(request, "token: paste a bearer token (kubectl create token …)")
            await callers.reader(token)
        except TokenRefused as exc:
            return login_page(request, f"token: {exc}")
        resp = web.Response(status=303, headers={"Location": "/"})
        secure = request.secure or request.headers.get("X-Forwarded-Proto") == "https"
        resp.set_cookie(
            COOKIE,
            token,
            max_age=COOKIE_MAX_AGE_S,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=secure,
        )
        return resp

    async def logout(_: web.Request) -> web.StreamResponse:
        resp = web.Response(status=303, headers={"Location": "/login"})
        resp.del_cookie(COOKIE, path="/")
        return resp

    def guarded(
        page: Callable[[web.Request, HubReader], Awaitable[web.Response]],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            who: HubReader | None = None
            try:
                who = await reader_of(request)
                return await page(request, who)
            except _NeedsLogin as exc:
                return login_page(request, exc.why and f"token: {exc.why}")
            except HubReadError as exc:
                return render(request, who, "error.html", code=502, error=str(exc))
            except OSError as exc:
                server = who.server if who is not None else (callers.server if callers else "")
                return render(
                    request,
                    who,
                    "error.html",
                    code=502,
                    error=f"cannot reach the hub cluster's API server {server}: {exc}",
                )

        return handler

    async def sample_shares(_: web.Application) -> AsyncIterator[None]:
        """Read the queues once a minute while the console runs, so the fair-share lines grow
        even when no one has the queues page open (as the console's one identity; served for
        callers, the console has none of its own and samples only the pages it serves)."""
        if not isinstance(reader, HubReader):
            yield
            return
        one = reader

        async def loop() -> None:
            while True:
                with contextlib.suppress(Exception):  # a failed read: the next minute tries
                    shares.note((await one.queues()).items)
                await asyncio.sleep(SHARE_EVERY_S)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app = web.Application(middlewares=[guard])
    app.cleanup_ctx.append(sample_shares)
    app.router.add_get("/", guarded(fleet_page))
    app.router.add_get("/queues", guarded(queues_page))
    app.router.add_get("/jobs", guarded(jobs_page))
    app.router.add_get("/jobs/{namespace}/{name}", guarded(job_page))
    app.router.add_get("/login", login_form)
    app.router.add_post("/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static/", _HERE / "static", show_index=False)
    return app

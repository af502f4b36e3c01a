"""The CLI's error line: every exception a command lets escape becomes one line
``error: <what> (fix: <how>)`` on stderr and exit code 1, never a Python traceback.

Installed at the top of the ``gpufed`` command (:class:`GpufedGroup`, used by ``cli/main.py``),
so it covers every sub-command. gpufed's own errors are translated from the one exception tree
(:mod:`gpufed.api.errors`, docs/design.md §11): a ``PermanentError`` (bad input: a
``FieldError``, a kubeconfig, fleet, trace or queues file, a selector ...) is its own message,
which names the field, file or flag and the fix; a ``TransientError`` its message and "try
again"; any other gpufed error is unexpected (below). Other libraries' errors get their own fix
(the Kubernetes client's kubeconfig errors, an API server that cannot be reached, 401/403/404
and other API errors, a file that cannot be read, YAML that does not parse, pydantic's invalid
values, and the standard library's ``ValueError``); anything else is named with its type and a
pointer to ``GPUFED_DEBUG=1``, which lets the traceback through instead. Usage errors (bad
flags) stay click's: exit code 2 with the usage text.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import typer
from typer._click.core import Context as ClickContext  # typer vendors click since 0.20
from typer.core import TyperGroup

from gpufed.api.errors import GpufedError, PermanentError, TransientError

__all__ = ["DEBUG_ENV", "GpufedGroup", "error_line"]

#: Set to 1 to see the traceback of an error instead of its one line.
DEBUG_ENV = "GPUFED_DEBUG"
_MAX_LINE = 1024


def error_line(exc: BaseException) -> str:
    """The one line (no newline, at most 1,024 characters) that reports ``exc``."""
    text = _describe(exc)
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) > _MAX_LINE:
        text = text[: _MAX_LINE - 1] + "…"
    return f"error: {text}"


def _describe(exc: BaseException) -> str:
    name = type(exc).__name__
    if isinstance(exc, GpufedError):
        return _gpufed_error(exc)
    module = type(exc).__module__
    if name == "ConfigException" and module.startswith(("kubernetes", "kubernetes_asyncio")):
        return (
            f"kubeconfig: {exc} (fix: check --kubeconfig/--context; `kubectl config "
            "get-contexts` lists what the file defines)"
        )
    status = getattr(exc, "status", None)
    # ApiException of either Kubernetes client, or its subclasses (ForbiddenException …)
    if isinstance(status, int) and hasattr(exc, "body") and module.startswith("kubernetes"):
        return _api_error(exc, status)
    if _is_connection_error(exc):
        reason = getattr(exc, "reason", None) or exc
        return (
            f"cannot reach the API server: {reason} (fix: is the cluster up? a local sandbox: "
            "`gpufed local status`; otherwise check --kubeconfig/--context)"
        )
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: no such file (fix: check the path)"
    if isinstance(exc, PermissionError):
        return f"{exc.filename or exc}: permission denied (fix: check the file's mode or owner)"
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename or exc}: is a directory (fix: name a file)"
    import yaml

    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or exc
        return f"not valid YAML{where}: {problem} (fix: check the file's indentation and quoting)"
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors()[:3]:
            loc = ".".join(str(p) for p in err["loc"])
            msg = str(err["msg"]).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        return f"invalid {exc.title}: {'; '.join(parts)} (fix: correct the value named)"
    if isinstance(exc, ValueError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
    return _unexpected(exc)


def _gpufed_error(exc: GpufedError) -> str:
    """gpufed's own errors, by the tree alone (never by the built-in base they also have)."""
    if isinstance(exc, PermanentError):
        return str(exc)
    if isinstance(exc, TransientError):
        return f"{exc} (fix: it may be temporary: run the command again)"
    return _unexpected(exc)


def _unexpected(exc: BaseException) -> str:
    return (
        f"{type(exc).__name__}: {exc} (an unexpected error: rerun with {DEBUG_ENV}=1 for the "
        "traceback, and report it)"
    )


def _api_error(exc: Any, status: int) -> str:
    try:
        message = str(json.loads(exc.body)["message"])
    except (ValueError, KeyError, TypeError):
        message = f"{status} {exc.reason}"
    fix = {
        401: "your credentials were refused: log in again or refresh the kubeconfig's token",
        403: "your user lacks the RBAC permission named; ask the cluster's admin, or use "
        "another --context",
        404: "the resource does not exist: are the gpufed CRDs installed? `gpufed hub install`",
        409: "it was changed meanwhile or exists already: run the command again",
        422: "the object is invalid: correct the field named",
    }.get(status)
    if fix is None and status >= 500:
        fix = "the API server failed: try again, or check its logs"
    return f"API server: {message}" + (f" (fix: {fix})" if fix else "")


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    module = type(exc).__module__
    if module.startswith("urllib3"):
        return True
    return module.startswith("aiohttp") and "Connect" in type(exc).__name__


class GpufedGroup(TyperGroup):
    """The top-level group: runs the command and reports what escapes it as one line."""

    def invoke(self, ctx: ClickContext) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, SystemExit):
            raise  # exits, aborts and usage errors (click's, vendored by typer) report themselves
        except KeyboardInterrupt:
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(130) from None
        except Exception as exc:
            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                raise
            typer.echo(error_line(exc), err=True)
            raise typer.Exit(1) from None

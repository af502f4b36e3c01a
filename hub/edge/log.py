"""structlog configuration of the hub process: JSON lines with fixed event names.

Called once by ``gpufed hub`` at start. Every log call names a fixed event
(``placement.decided``, ``agent.connected`` ...) and binds context as keys (``job=``,
``cluster=``); docs/hub.md lists the events.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(*, json: bool = True, level: str = "info") -> None:
    """Route structlog (and stdlib logging) to stderr as JSON lines (or console text)."""
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

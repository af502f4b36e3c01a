"""Unit-test fixtures of the agent: structlog goes through the logging module (captured by
pytest per test) instead of printing to a stream that pytest may have closed."""

from __future__ import annotations

import pytest

from tests.integration.agent.conftest import log_to_stdlib


@pytest.fixture(scope="session", autouse=True)
def _structlog_to_stdlib() -> None:
    log_to_stdlib()

"""Fixtures of the console tests: the hub cluster with the gpufed CRDs (the hub tests'
``hub_kubeconfig``), a headless Chromium driven by selenium, and a console process per
identity (:mod:`tests.integration.console.harness`)."""

from __future__ import annotations

from tests.integration.hub.conftest import hub_kubeconfig

__all__ = ["hub_kubeconfig"]

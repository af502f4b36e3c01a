"""Unit-test settings.

Hypothesis' per-example deadline is a timed assertion in disguise: on a loaded 2-core machine
it fails tests for being slow, not wrong. Speed is measured by benchmarks instead.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("gpufed", deadline=None)
settings.load_profile("gpufed")

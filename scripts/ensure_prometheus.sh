#!/usr/bin/env bash
# Make sure `prometheus` and `promtool` are on PATH for the monitoring tests
# (tests/integration/test_monitoring_rules.py, tests/e2e/test_8_monitoring.py). Called by the
# setup step of scripts/test.sh. Idempotent and instant when both are present; otherwise
# installs Debian's `prometheus` package (it ships both) with apt-get, as root or with sudo.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  echo "prometheus present: $(prometheus --version 2>&1 | head -1)"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "error: prometheus/promtool not on PATH and no apt-get here: install Prometheus >= 2.37" \
       "(https://prometheus.io/download/) so that both are on PATH" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "error: installing the prometheus package needs root (or sudo)" >&2
    exit 1
  fi
  SUDO=sudo
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus
prometheus --version 2>&1 | head -1

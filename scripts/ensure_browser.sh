#!/usr/bin/env bash
# Make sure a headless Chromium and its WebDriver are on PATH for the console's browser tests
# (tests/integration/console/). Called by the setup steps of scripts/test.sh. Idempotent and
# instant when both are present; otherwise installs Debian's `chromium` and `chromium-driver`
# packages with apt-get (about 100 MB, ~1 min), as root or with sudo. Without apt-get it says
# what to install and exits 0: the browser tests then skip, naming what is missing.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  echo "chromium present: $(chromedriver --version 2>/dev/null | cut -d' ' -f1-2)"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "warning: no chromium/chromedriver on PATH and no apt-get here: install Chromium and" \
       "its chromedriver (same version) so that both are on PATH, or the console's browser" \
       "tests skip" >&2
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "error: installing chromium needs root (or sudo)" >&2
    exit 1
  fi
  SUDO=sudo
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
  chromium chromium-driver
chromedriver --version

#!/usr/bin/env python3
"""Screenshots and load times of a running ``gpufed console`` in headless Chromium.

Usage: ``.venv/bin/python scripts/console_shots.py URL OUT_DIR [--prefix P] [--job NS/NAME ...]``

Loads ``/``, ``/queues``, ``/jobs`` and each ``/jobs/NS/NAME`` given (or the newest job the
jobs page lists) in Debian's chromium (``scripts/ensure_browser.sh``), saves a full-page PNG of
each as ``OUT_DIR/<prefix><page>.png`` and prints one JSON line: per page the server's time to
the first byte and the browser's time to the load event (milliseconds, from the Navigation
Timing API, median of ``--repeat`` loads), the HTML size and the page's element count.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any


def _driver(width: int, height: int) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        sys.exit(
            "error: no chromium/chromedriver on PATH (scripts/ensure_browser.sh installs them)"
        )
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.add_argument(f"--window-size={width},{height}")
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def _timing(d: Any) -> dict[str, float]:
    t = d.execute_script(
        "const n = performance.getEntriesByType('navigation')[0];"
        "return {ttfb: n.responseStart - n.requestStart, load: n.loadEventEnd - n.startTime,"
        " bytes: n.transferSize, elements: document.getElementsByTagName('*').length};"
    )
    return {k: float(v) for k, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--prefix", default="")
    ap.add_argument("--job", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--width", type=int, default=1400)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    d = _driver(args.width, 1000)
    base = args.url.rstrip("/")
    pages = [("fleet", "/"), ("queues", "/queues"), ("jobs", "/jobs")]
    results: dict[str, Any] = {}
    try:
        jobs = list(args.job)
        if not jobs:
            from selenium.webdriver.common.by import By

            d.get(f"{base}/jobs")
            rows = d.find_elements(By.CSS_SELECTOR, "tr[data-job]")
            jobs = [str(rows[0].get_attribute("data-job"))] if rows else []
        pages += [(f"job-{j.replace('/', '-')}", f"/jobs/{j}") for j in jobs]
        for name, path in pages:
            runs = []
            for _ in range(max(1, args.repeat)):
                d.get(base + path)
                runs.append(_timing(d))
            results[name] = {
                "path": path,
                "ttfb_ms": round(statistics.median(r["ttfb"] for r in runs), 1),
                "load_ms": round(statistics.median(r["load"] for r in runs), 1),
                "html_bytes": int(runs[-1]["bytes"]),
                "elements": int(runs[-1]["elements"]),
            }
            height = int(d.execute_script("return document.documentElement.scrollHeight"))
            d.set_window_size(args.width, min(max(height, 600), 8000))
            d.save_screenshot(str(args.out / f"{args.prefix}{name}.png"))
            d.set_window_size(args.width, 1000)
    finally:
        d.quit()
    print(json.dumps({"url": base, "pages": results}))


if __name__ == "__main__":
    main()

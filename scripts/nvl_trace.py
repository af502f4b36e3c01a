"""Write manifests/traces/msft-itp-week-nvl.csv: the ITP week with clique-sized GB200 jobs.

The loaded fleet of issue 29 (manifests/fleets/sim-itp-loaded.yaml) has a GB200 NVL72 member
whose multi-node NVLink capacity is scarce. The ITP trace has no topology column, so this turns
every 16- and 32-GPU job with an even job_id into a job that must sit in one NVL72 clique:
``gpus_per_pod=4`` (one GB200 tray), ``topology=required``, ``gpu_product=NVIDIA-GB200``. Every
other row is unchanged (defaults: ``min(gpus, 8)`` GPUs per pod, any product). Deterministic;
run ``python scripts/nvl_trace.py`` from the repository root.
"""

from __future__ import annotations

import csv
from pathlib import Path

SOURCE = Path("manifests/traces/msft-itp-week.csv")
TARGET = Path("manifests/traces/msft-itp-week-nvl.csv")
COLUMNS = ("job_id", "submit_s", "gpus", "duration_s", "gpus_per_pod", "topology", "gpu_product")


def main() -> None:
    with SOURCE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    with TARGET.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for r in rows:
            gpus = int(r["gpus"])
            clique = gpus in (16, 32) and int(r["job_id"]) % 2 == 0
            out.writerow(
                (
                    r["job_id"],
                    r["submit_s"],
                    gpus,
                    r["duration_s"],
                    4 if clique else "",
                    "required" if clique else "",
                    "NVIDIA-GB200" if clique else "",
                )
            )


if __name__ == "__main__":
    main()

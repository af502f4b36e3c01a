"""Without --etcd the hub runs a private etcd in its data directory, and stops it on exit."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest

from gpufed.sandbox.binaries import BinDir
from tests.integration.hub.harness import hub_config, running_hub

pytestmark = pytest.mark.integration


async def test_the_hub_leads_on_its_embedded_etcd_and_stops_it(
    tmp_path: Path, hub_kubeconfig: Path, sandbox_bin_dir: BinDir
) -> None:
    cfg = hub_config(tmp_path, hub_kubeconfig, "", "/gpufed/hub/", etcd_endpoints=())
    async with running_hub(cfg, etcd_binary=sandbox_bin_dir.etcd) as hub:
        assert hub.embedded_etcd is not None
        pid = hub.embedded_etcd.pid
        assert pid is not None
        assert (tmp_path / "data" / "etcd").is_dir()
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{hub.http_port}/readyz") as r:
                assert (r.status, await r.text()) == (200, "leader\n")
            async with s.get(f"http://127.0.0.1:{hub.http_port}/metrics") as r:
                assert "gpufed_hub_is_leader 1.0" in await r.text()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

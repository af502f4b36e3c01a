"""The committed protocol stubs are exactly what api/protocol/agent.proto generates."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = gen
    spec.loader.exec_module(gen)
    written = gen.generate(tmp_path)
    assert written, "no stubs generated"
    stale = [
        p.name
        for p in written
        if p.read_bytes() != (ROOT / "api" / "protocol" / p.name).read_bytes()
    ]
    assert not stale, f"stale protocol stubs {stale}: run scripts/gen_protos.py and commit"


def test_stubs_import_as_part_of_the_package() -> None:
    from gpufed.api.protocol import agent_pb2, agent_pb2_grpc

    msg = agent_pb2.AgentMessage(hello=agent_pb2.Hello(cluster="a", protocol_version=1))
    assert agent_pb2.AgentMessage.FromString(msg.SerializeToString()).hello.cluster == "a"
    assert hasattr(agent_pb2_grpc, "AgentServiceStub")

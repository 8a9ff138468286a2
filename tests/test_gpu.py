"""The NCCL path on a real NVIDIA GPU: skipped on machines without one (CI here has none)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no NVIDIA GPU on this machine (torch sees no CUDA)"),
]


def test_gang_on_a_detected_gpu_uses_nccl(tmp_path):
    import asyncio
    import os

    import gangs
    from conftest import NodeAgent, WorkerProcess

    from engine.client import Client
    from engine.runtime import DevServer, Endpoint, connect

    with DevServer(tmp_path / "server", ui=False) as srv:
        worker = WorkerProcess(srv.address, "gangflow", tmp_path / "worker").start()
        node = NodeAgent(srv.address, "gpu-0", -1, tmp_path / "node")  # -1: let the agent detect its GPUs
        try:

            async def main() -> dict:
                client = Client(await connect(Endpoint.resolve(srv.address)), str(tmp_path / "artifacts"))
                while (await client.queue())["totals"]["alive_nodes"] < 1:
                    await asyncio.sleep(0.3)
                run_id = await client.start(gangs.on_gpu, {})
                return await client.result(run_id, gangs.on_gpu)

            result = asyncio.run(main())
        finally:
            node.stop()
            worker.stop()
    assert result["backend"] == "nccl" and result["device"].startswith("cuda")
    assert result["visible"] == os.environ.get("GANGFLOW_EXPECT_VISIBLE", "0")

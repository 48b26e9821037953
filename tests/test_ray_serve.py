"""`squant serve --ray`: two Ray Serve replicas on this machine, one core each, both answer
and agree (slow: starts a local Ray instance; skipped without the ray extra)."""

import socket
import time

import pytest

pytest.importorskip("ray")
pytest.importorskip("httpx")

import httpx
import ray

from squant.engine.engine import ServeConfig
from squant.serve.ray_app import RayConfig, application, replica_cores


def test_replica_cores_split_the_node():
    import os

    available = sorted(os.sched_getaffinity(0))
    assert replica_cores(0, 1) == available[:1]
    with pytest.raises(Exception, match="fewer replicas per node"):
        replica_cores(len(available), 1)


def test_two_replicas_answer_and_agree(base_dir):
    from ray import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        config = ServeConfig(instances=1, cores_per_instance=1, runtime="eager")
        serve.run(application(base_dir, config, RayConfig(replicas=2, cores_per_replica=1)))
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while httpx.get(f"{url}/ready", timeout=5).status_code != 200:
            assert time.time() < deadline, "replicas never became ready"
            time.sleep(1)
        pids, vectors = set(), []
        for _ in range(60):
            pids.add(httpx.get(f"{url}/info", timeout=10).json()["pid"])
            r = httpx.post(f"{url}/embed", json={"inputs": "the cat sat on the mat"}, timeout=30)
            assert r.status_code == 200
            vectors.append(r.json()[0])
            if len(pids) == 2 and len(vectors) >= 10:
                break
        assert len(pids) == 2, f"only {pids} answered"
        first = vectors[0]
        for v in vectors[1:]:  # whichever replica answered: the same embedding
            dot = sum(a * b for a, b in zip(first, v, strict=True))
            norm = (sum(a * a for a in first) * sum(b * b for b in v)) ** 0.5
            assert dot / norm > 0.9999
    finally:
        serve.shutdown()
        ray.shutdown()


def test_sigterm_stops_a_ray_backed_server_cleanly(base_dir):
    """SIGTERM is how an orchestrator stops a server: exit 0, no native stack dump (Ray's
    fatal-signal handler prints one unless squant handles the signal first)."""
    import os
    import signal
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    squant = os.path.join(os.path.dirname(sys.executable), "squant")
    args = [squant, "serve", str(base_dir), "--ray", "--port", str(port), "--runtime", "eager"]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, server.communicate()[0][-2000:]
            time.sleep(0.5)
        else:
            pytest.fail("the Ray-backed server did not become ready in 180 s")
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, output[-2000:]
    assert "SIGTERM received" not in output and "Traceback" not in output, output[-2000:]

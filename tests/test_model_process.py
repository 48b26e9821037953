"""`squant serve --model-process`: the model runs in a child process, answers what the
in-process engine answers, and its death is reported, never hidden."""

import os
import signal
import time

import pytest
import torch

pytest.importorskip("fastapi")

import squant
from squant.engine.engine import ServeConfig
from squant.engine.loading import engine_for
from squant.engine.model_process import ModelProcessError
from tests.helpers import cosine

TEXTS = ["the cat sat on the mat", "a dog runs fast in the park", "red car", ""]
# eager: the child's compile is what --runtime auto would do; compiling is tested elsewhere
CONFIG = ServeConfig(instances=1, cores_per_instance=1, runtime="eager", model_process=True)


def _embed(engine, texts):
    return torch.stack([f.result(timeout=60) for f in engine.submit(engine.tokenize(texts))])


@pytest.fixture
def remote_engine(base_dir):
    engine = engine_for(base_dir, CONFIG)
    engine.start()
    yield engine
    engine.stop(1.0)


def test_the_model_process_answers_what_the_in_process_engine_answers(remote_engine, base_dir):
    local = engine_for(base_dir, ServeConfig(instances=1, cores_per_instance=1, runtime="eager"))
    local.start(warm=False)
    try:
        expected = _embed(local, TEXTS)
    finally:
        local.stop(1.0)
    got = _embed(remote_engine, TEXTS)
    encoded = local.tokenize(TEXTS)
    per_token = [f.result(timeout=60) for f in remote_engine.submit(encoded, per_token=True)]
    assert [len(rows) for rows in per_token] == [len(ids) for ids, _ in encoded]
    assert got.shape == expected.shape
    # the same weights and kernels in another process: equal to float rounding
    assert cosine(expected, got) > 0.99999
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    # the server process holds no weights: the one copy is the child's; it knows the model
    # by its description (what /info and the routes read)
    assert not list(remote_engine.model.parameters())
    assert remote_engine.task == local.task == "embed"
    assert remote_engine.max_length == local.max_length
    assert remote_engine.model.config.to_dict() == local.model.config.to_dict()
    from fastapi.testclient import TestClient

    from squant.serve.app import create_app

    info = TestClient(create_app(remote_engine, "tiny")).get("/info").json()
    assert info["model_class"] == "BertModel" and info["quantization"]["mode"] == "static"
    child = remote_engine.executor.process
    assert child.pid != os.getpid() and child.is_alive() and remote_engine.healthy()
    remote_engine.stop(1.0)  # and stop ends it
    assert not child.is_alive() and not remote_engine.healthy()


def test_a_dead_model_process_fails_its_requests_and_health(remote_engine):
    _embed(remote_engine, TEXTS[:1])
    os.kill(remote_engine.executor.process.pid, signal.SIGKILL)
    remote_engine.executor.process.join(10)
    futures = remote_engine.submit(remote_engine.tokenize(TEXTS[:2]))
    for f in futures:
        with pytest.raises(ModelProcessError, match="died"):
            f.result(timeout=30)
    deadline = time.monotonic() + 5
    while remote_engine.healthy() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not remote_engine.healthy()  # /health answers 503, Ray restarts the replica


def test_model_process_refuses_what_it_cannot_serve(base_dir, tiny_checkpoint, deploy_dir):
    with pytest.raises(squant.SquantError, match="squant quantize first"):
        engine_for(tiny_checkpoint, CONFIG, calib=base_dir / "none.txt")
    with pytest.raises(squant.SquantError, match="not deploy directories"):
        engine_for(deploy_dir[1], CONFIG)
    with pytest.raises(squant.SquantError, match="model_process"):
        ServeConfig(model_process=True, watch_ranges=True)


def test_the_serve_command_runs_a_model_process_where_a_core_is_left_over(
    tiny_checkpoint, deploy_dir, monkeypatch
):
    import argparse

    from squant.commands import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)

    def wanted(*argv):
        return serve.serve_config(p.parse_args([str(tiny_checkpoint), *argv])).model_process

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert wanted("--instances", "1", "--cores-per-instance", "1")  # core 1 is the front end's
    assert not wanted("--instances", "2", "--cores-per-instance", "1")  # none left over
    assert not wanted("--instances", "1", "--cores-per-instance", "1", "--model-process", "off")
    assert wanted("--instances", "2", "--cores-per-instance", "1", "--model-process", "on")
    for other in (["--calib", "x.txt"], ["--watch-ranges"], ["--ray"]):
        assert not wanted("--instances", "1", "--cores-per-instance", "1", *other)
    args = p.parse_args([str(tiny_checkpoint), "--attention", "sdpa"])
    assert serve.serve_config(args).attention == "sdpa"  # the flag reaches the compile
    args = p.parse_args([str(deploy_dir[1]), "--instances", "1", "--cores-per-instance", "1"])
    assert not serve.serve_config(args).model_process  # a package: not supported there

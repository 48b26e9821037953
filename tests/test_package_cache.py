"""A quantized directory served from its AOTInductor package: exported once with a dynamic
batch and sequence length, cached by content, run through squant's kernel library with the
GIL released, checked against eager at every load."""

from __future__ import annotations

import shutil
import sys
import threading
import time

import pytest
import torch

import squant
from squant import kernels
from squant.checkpoint.models import load_tokenizer
from squant.engine.engine import ServeConfig
from squant.engine.loading import engine_for
from squant.engine.package_cache import package_cache, package_key
from squant.kernels.package_runner import NativePackageRunner
from squant.runtime.compiler import agreement
from squant.runtime.export import MAX_BATCH, ExportConfig, export, load_exported
from squant.runtime.shapes import PaddedShapes

ONE_CORE = {"instances": 1, "cores_per_instance": 1}

pytestmark = pytest.mark.compile


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """squant's cache in a fresh directory; the kernel library stays where it is built."""
    kernels.load()
    monkeypatch.setenv("SQUANT_KERNEL_CACHE", str(kernels.kernel_cache()))
    monkeypatch.setenv("SQUANT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _no_compile(*args, **kwargs):
    raise AssertionError("compiled although a package was expected")


def _texts_inputs(tok, texts):
    return tok(texts, padding=True, return_tensors="pt")


def test_a_quantized_directory_is_served_from_its_package_built_once(
    base_dir, private_cache, monkeypatch
):
    monkeypatch.setattr("squant.runtime.compiler.compile", _no_compile)
    engine = engine_for(base_dir, ServeConfig(**ONE_CORE))
    assert isinstance(engine.model, PaddedShapes) and not engine.model.pad_rows
    exported = engine.model.model.exported
    assert exported.manifest["dynamic_batch"] and exported.manifest["dynamic_seq"]
    assert isinstance(exported.runner, NativePackageRunner)  # the GIL-free runner
    entry = package_cache() / package_key(base_dir)
    assert entry.is_dir() and entry.parent == private_cache / "packages"

    # any batch, any length: the same vectors as the eager quantized model
    tok = load_tokenizer(base_dir)
    eager = squant.load(base_dir)
    texts = ["a dog", "the cat sat on the mat " * 6, "", "red car", "the man is happy"]
    for n in (1, 3, 5):
        x = _texts_inputs(tok, texts[:n])
        with torch.no_grad():
            ref = eager(**x).last_hidden_state
            out = engine.model(**x).last_hidden_state
        assert out.shape == ref.shape
        assert agreement(ref, out, x["attention_mask"]) > 0.999

    # a second start loads it: nothing is exported again
    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the package is cached")

    monkeypatch.setattr(sys.modules["squant.runtime.export"], "export", no_export)
    again = engine_for(base_dir, ServeConfig(**ONE_CORE))
    assert again.model.model.exported.manifest["sha256"] == exported.manifest["sha256"]


def test_the_cache_key_follows_the_content_not_the_path(base_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(base_dir, copy)
    assert package_key(copy) == package_key(base_dir)
    record = copy / "squant.json"
    record.write_text(record.read_text() + "\n")  # any change of a defining file
    changed = package_key(copy)
    assert changed != package_key(base_dir)
    (copy / "README.md").write_text("notes")  # not a defining file
    assert package_key(copy) == changed
    with pytest.raises(squant.SquantError, match="not a directory"):
        package_key(tmp_path / "missing")


def test_a_package_that_disagrees_is_dropped_and_the_model_compiled(
    base_dir, private_cache, monkeypatch
):
    compiled = []

    def fake_compile(model, config, example_inputs):
        compiled.append(config)
        return _FakeCompiled(model)

    monkeypatch.setattr("squant.runtime.compiler.compile", fake_compile)
    monkeypatch.setattr("squant.runtime.compiler.agreement", lambda *a: 0.5)
    with pytest.warns(UserWarning, match=r"disagrees with the eager model \(cosine 0.50000"):
        engine = engine_for(base_dir, ServeConfig(**ONE_CORE))
    assert len(compiled) == 1 and isinstance(engine.runner, _FakeCompiled)
    assert not (package_cache() / package_key(base_dir)).exists()  # not kept

    # asked for by name, a package that cannot be built is an error, not a compile
    def no_compiler(*args):
        raise squant.SquantError("building squant's C++ kernels failed: no compiler")

    monkeypatch.setattr("squant.engine.package_cache._build", no_compiler)
    with pytest.raises(squant.SquantError, match=r"--runtime package: .*no compiler"):
        engine_for(base_dir, ServeConfig(runtime="package", **ONE_CORE))
    # naming the runtime or the attention compiles, as before
    engine_for(base_dir, ServeConfig(runtime="compiled", **ONE_CORE))
    engine_for(base_dir, ServeConfig(attention="sdpa", **ONE_CORE))
    assert len(compiled) == 3


class _FakeCompiled:
    def __init__(self, model):
        self.model = model

    def __call__(self, **inputs):
        return self.model(**inputs)


def _spins_during_calls(call, seconds: float = 0.5) -> int:
    """How often a Python thread ran while `call` was inside its native part: the spinner
    stamps the time of each of its steps, and a step counts when it falls in the middle half
    of a call (away from the Python code at either end, where the interpreter may switch
    threads on its own). Zero if the call keeps the GIL."""
    stamps: list[float] = []
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            stamps.append(time.perf_counter())

    spinner = threading.Thread(target=spin)
    spinner.start()
    calls = []
    try:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            call()
            calls.append((t0, time.perf_counter()))
    finally:
        stop.set()
        spinner.join()
    middles = [(a + (b - a) / 4, b - (b - a) / 4) for a, b in calls]
    return sum(1 for t in stamps for a, b in middles if a < t < b)


def test_the_native_runner_releases_the_gil_where_torchs_binding_does_not(
    base_dir, private_cache, tmp_path
):
    model = squant.load(base_dir)
    tok = load_tokenizer(base_dir)
    config = ExportConfig(batch=2, seq=16, dynamic_seq=True, dynamic_batch=True)
    export(model, tmp_path / "deploy", None, tok, config)
    native = load_exported(tmp_path / "deploy")
    assert isinstance(native.runner, NativePackageRunner)
    from torch._inductor.package import load_package

    binding = load_package(str(tmp_path / "deploy" / "model.pt2"))
    x = _texts_inputs(tok, ["the cat sat on the mat " * 10] * 512)  # long native calls
    ids, mask = x["input_ids"], x["attention_mask"]
    types = torch.zeros_like(ids)
    for a, b in zip(native.runner(ids, mask, types), binding(ids, mask, types), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same package, the same output
    with_native = _spins_during_calls(lambda: native.runner(ids, mask, types))
    with_binding = _spins_during_calls(lambda: binding(ids, mask, types))
    assert with_native > 100
    assert with_native > 20 * max(with_binding, 1)

    # a dynamic batch: any batch from 1 to MAX_BATCH, checked before the package sees it
    ids = torch.full((0, 4), 5)
    with pytest.raises(squant.SquantError, match=rf"batch 0 outside \[1, {MAX_BATCH}\]"):
        native(ids, torch.ones_like(ids))
    ids = torch.full((7, 4), 5)
    assert native(ids, torch.ones_like(ids))[0].shape[0] == 7

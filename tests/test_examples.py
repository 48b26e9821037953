"""The scripts in examples/ run as documented, on a tiny base model: quantize and compile,
export and load, serve and query with the OpenAI client."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from squant.checkpoint.models import load_tokenizer
from tests.helpers import tiny_model

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stdout


def _cosines(output: str) -> list[float]:
    return [float(x) for x in re.findall(r": (?:cosine )?(0\.\d+|1\.0+)$", output, re.M)]


@pytest.fixture(scope="module")
def base_checkpoint(tiny_checkpoint, tmp_path_factory):
    """A tiny BERT base model (it embeds) with the tiny checkpoint's real tokenizer."""
    path = tmp_path_factory.mktemp("examples") / "tiny-base"
    tok = load_tokenizer(tiny_checkpoint)
    model = tiny_model("bert", vocab_size=len(tok))
    model.config.architectures = ["BertModel"]
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def test_the_examples_run_end_to_end(base_checkpoint, tmp_path):
    int8, deploy = tmp_path / "int8", tmp_path / "deploy"
    out = _run("quantize_and_compile.py", str(base_checkpoint), "--out", str(int8))
    assert (int8 / "squant.json").is_file()
    assert min(_cosines(out)) > 0.99, out
    out = _run("export_and_load.py", str(int8), "--out", str(deploy))
    assert (deploy / "model.pt2").is_file()
    cosines = _cosines(out)
    assert len(cosines) == 2 and min(cosines) > 0.999, out
    out = _run("serve_and_client.py", str(int8))
    assert out.count(" floats, first ") == 2 and "usage:" in out, out

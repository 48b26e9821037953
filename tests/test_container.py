"""The container files: what they pin and run agrees with the package (no Docker needed)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from squant.commands.serve import API_KEY_ENV

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instruction(name: str) -> str:
    """One Dockerfile instruction's arguments, continuation lines joined."""
    text = DOCKERFILE.replace("\\\n", " ")
    found = re.findall(rf"^{name}\s+(.*)$", text, flags=re.MULTILINE)
    assert found, f"no {name} in the Dockerfile"
    return found[-1]


def test_the_image_installs_the_torch_the_package_pins_from_the_cpu_index():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_pin = next(d for d in deps if d.startswith("torch=="))
    run = " ".join(re.findall(r"^RUN\s+(.*)$", DOCKERFILE.replace("\\\n", " "), re.MULTILINE))
    assert torch_pin in run
    assert "download.pytorch.org/whl/cpu" in run
    assert "g++" in run  # inductor and squant's kernels compile at start-up


def test_the_image_runs_squant_serve_as_a_non_root_user():
    user = _instruction("USER").strip()
    assert user not in ("root", "0")
    assert _instruction("ENTRYPOINT").startswith('["squant", "serve"')


def _status_server(status: int) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/ready" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_the_healthcheck_passes_only_when_ready(status, healthy):
    command = shlex.split(_instruction("HEALTHCHECK").split(" CMD ", 1)[1])
    assert command[:2] == ["python", "-c"]
    server = _status_server(status)
    try:
        script = command[2].replace("127.0.0.1:8080", f"127.0.0.1:{server.server_port}")
        rc = subprocess.run([sys.executable, "-c", script], capture_output=True).returncode
    finally:
        server.shutdown()
    assert (rc == 0) == healthy


def test_compose_passes_the_api_key_variable_serve_reads():
    compose = (ROOT / "deploy" / "compose.yaml").read_text()
    assert f"{API_KEY_ENV}:" in compose
    assert "/home/squant/.cache" in compose  # the kernel and compile caches survive restarts


def test_a_wheel_carries_every_file_the_package_reads_besides_its_modules():
    """A non-editable install (the image's `pip install .`) gets only what package-data lists:
    without the C++ sources the int8 attention kernel cannot be built there."""
    import fnmatch

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["squant"]
    package = ROOT / "squant"
    extra = [
        p.relative_to(package).as_posix()
        for p in package.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert "py.typed" in extra and any(f.endswith(".cpp") for f in extra)
    missing = [f for f in extra if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"add to [tool.setuptools.package-data]: {missing}"

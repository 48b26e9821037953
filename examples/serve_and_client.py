"""Serve a quantized directory and query it with the OpenAI client.

    python examples/serve_and_client.py int8/

Starts `squant serve int8/` on a free port, waits for /ready, asks for embeddings through the
`openai` package with its default settings (as LangChain and most tools do), and stops the
server. The same server answers TEI's routes (/embed, /embed_all, POST /) and /v1/models.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:  # not listening yet, or 503 while warming up
            pass
        time.sleep(0.5)
    sys.exit(f"the server was not ready after {timeout_s:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a directory from squant quantize, or a deploy directory")
    args = p.parse_args()

    from openai import OpenAI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    squant = os.path.join(os.path.dirname(sys.executable), "squant")
    server = subprocess.Popen([squant, "serve", args.model, "--port", str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, server)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        texts = ["a dog runs in the park", "the cat sat on the mat"]
        response = client.embeddings.create(model="squant", input=texts)
        for text, item in zip(texts, response.data, strict=True):
            print(f"{text!r}: {len(item.embedding)} floats, first {item.embedding[0]:.4f}")
        print(f"usage: {response.usage.prompt_tokens} tokens")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    main()

"""What many users serve today, as the load benchmark's baseline: a plain FastAPI app around a
transformers FP32 model, one request at a time, torch threads = the cores it may use.

    python benchmarks/baseline_server.py MODEL_DIR --port 8090 --threads 2

POST /embed {"inputs": str | [str], "normalize": bool} -> mean-pooled vectors (TEI's shape),
GET /ready -> 200. No batching, no queue bound: the plain way.
"""

from __future__ import annotations

import argparse

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from transformers import AutoModel, AutoTokenizer


class EmbedRequest(BaseModel):
    inputs: str | list[str]
    normalize: bool = False


def create_app(model_dir: str) -> FastAPI:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    app = FastAPI()

    @app.get("/ready")
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/embed")
    def embed(req: EmbedRequest) -> list[list[float]]:  # a sync route: FastAPI's thread pool
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        enc = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        with torch.inference_mode():
            h = model(**enc).last_hidden_state
        m = enc["attention_mask"].unsqueeze(-1).float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        if req.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.tolist()

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: cores)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    uvicorn.run(create_app(args.model), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

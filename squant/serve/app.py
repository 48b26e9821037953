"""HTTP routes over the Engine, compatible with TEI and OpenAI clients.

    POST /embed            {"inputs": str | [str] | [id] | [[id]], "normalize": bool?,
                            "truncate": bool?} -> [[float]]       (TEI)
    POST /v1/embeddings    {"input": str | [str] | [id] | [[id]], "model": str?}
                           (OpenAI; usage counts tokens)
    POST /predict          {"inputs": str | [str, str] | [str | [str, str]]}
                           -> [[{"label", "score"}]] per input, best first (TEI)
    POST /rerank           {"query": str, "texts": [str], "raw_scores"?, "return_text"?}
                           -> [{"index", "score", "text"?}] best first (TEI; cross-encoders)
    POST /tokenize         {"inputs": str | [str]} -> per input, [{id, text, special, start,
                           stop}] (TEI)
    POST /                 TEI's root: /embed's body and answer for a base model, /predict's
                           for a classifier (huggingface_hub's InferenceClient posts here)
    GET  /v1/models        OpenAI's model list (the one model served)
    GET  /health  /ready  /info  /metrics (Prometheus)

Errors are JSON {"error", "error_type"} (under /v1/, OpenAI's {"error": {"message", "type",
"param", "code"}}, code being the error_type): 400 empty input or a body that is not UTF-8, 404
unknown route, 413 too many inputs or too large a body, 422 malformed JSON, wrong types or
over-length input with truncate=false, 429 queue full (with
Retry-After), 503 not ready or draining, 504 deadline passed in the queue. Never a 500 for
bad input.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel, StrictInt, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware

from ..data import Text
from ..engine.batching import Admission, DeadlineExceededError, OverloadedError
from ..engine.engine import Engine
from ..errors import SquantError
from ..quant.mappings import hf_config
from ..quant.record import record_of
from .error_body import error_body
from .fast_path import FastRoute
from .front_door import FrontDoor

MAX_BODY_BYTES = 2 * 2**20
# the routes that queue inference work: refused at the front door while overloaded
INFERENCE_ROUTES = frozenset({"/", "/embed", "/v1/embeddings", "/predict", "/rerank"})
# requests this short are tokenized on the event loop (~35-60 us a sentence): handing them to
# a tokenizer thread cost more in thread wake-ups on the core the model shares. Longer ones
# go to the threads, so one big request cannot stall the loop for others.
INLINE_TOKENIZE_CHARS = 2048


# what the embedding routes take, as OpenAI and TEI do: a text, texts, one tokenized input
# (ids of the served model's vocabulary) or several. Strict: true or 1.0 is not a token id.
EmbedInputs = str | list[str] | list[StrictInt] | list[list[StrictInt]]


@dataclass(frozen=True)
class TokenIds:
    """Inputs the client tokenized itself: one id list per input."""

    sequences: list[list[int]]


class EmbedRequest(BaseModel):
    inputs: EmbedInputs
    normalize: bool | None = None
    truncate: bool = True


class EmbedAllRequest(BaseModel):
    inputs: str | list[str]
    truncate: bool = True


class OpenAIEmbeddingRequest(BaseModel):
    input: EmbedInputs
    model: str | None = None
    # the openai SDK (and LangChain's OpenAIEmbeddings) ask for base64 unless told otherwise
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


class PredictRequest(BaseModel):
    inputs: str | list[str | list[str]]
    truncate: bool = True


class RerankRequest(BaseModel):
    """TEI's /rerank body: the query scored against each text by a cross-encoder."""

    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = True


class TokenizeRequest(BaseModel):
    inputs: str | list[str]
    add_special_tokens: bool = True


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


def _metrics(registry: CollectorRegistry) -> dict[str, Any]:
    return {
        "requests": Counter(
            "squant_requests_total",
            "requests by route and status",
            ["route", "status"],
            registry=registry,
        ),
        "tokenize": Histogram(
            "squant_tokenize_seconds", "tokenization per request", registry=registry
        ),
        "total": Histogram(
            "squant_request_seconds", "time in the server per request", registry=registry
        ),
        "queue": Gauge("squant_queue_sequences", "sequences waiting", registry=registry),
        "queue_s": Gauge(
            "squant_queue_work_seconds", "estimated time to run the queue", registry=registry
        ),
        "in_flight": Gauge(
            "squant_requests_in_flight", "admitted, not yet answered", registry=registry
        ),
    }


@dataclass(frozen=True)
class HttpConfig:
    """What the HTTP layer adds around the engine.

    model_name: the name /info and /v1/models report (and clients may send as `model`).
    api_key: when set, every route but /health and /ready needs `Authorization: Bearer KEY`.
    cors_origins: browser origins allowed to call the API (CORS); none by default, and "*"
        allows any (with an API key, the key is then what guards the API).
    """

    model_name: str = "squant"
    api_key: str | None = None
    cors_origins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.model_name.strip():
            raise SquantError("the served model name is empty")
        if self.api_key is not None and not self.api_key.strip():
            raise SquantError("the API key is empty (unset it to serve without one)")
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))


def create_app(
    engine: Engine,
    model_name: str = "squant",
    grace_s: float = 30.0,
    http: HttpConfig | None = None,
) -> FastAPI:
    """The FastAPI app over an engine; http (if given) names the model and sets the API key
    and CORS origins, model_name otherwise."""
    http = http or HttpConfig(model_name=model_name)
    model_name = http.model_name

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        # SIGTERM (uvicorn stops accepting first): finish what was admitted, then stop
        await asyncio.to_thread(engine.stop, grace_s)

    app = FastAPI(title="squant", version="1", lifespan=lifespan)
    registry = CollectorRegistry()
    m = _metrics(registry)
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def _api_error(req: Request, e: ApiError) -> JSONResponse:
        return _error(e, req.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, e: StarletteHTTPException) -> JSONResponse:
        kinds = {400: "bad_request", 404: "not_found", 405: "method_not_allowed"}
        kind = kinds.get(e.status_code, "http")
        return JSONResponse(
            error_body(req.url.path, e.status_code, str(e.detail), kind),
            status_code=e.status_code,
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(req: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {"msg": "invalid body"}
        where = ".".join(str(x) for x in first.get("loc", ()))
        message = f"{where}: {first.get('msg')}"
        return JSONResponse(error_body(req.url.path, 422, message, "validation"), status_code=422)

    known_routes: set[str] = set()  # filled once every route below is declared
    # added first, so it runs inside the front door (counted, refused early when overloaded)
    app.add_middleware(
        FastRoute,
        path="/embed",
        parse=_plain_embed_body,
        handle=lambda *args: embed_fast(*args),
        max_body_bytes=MAX_BODY_BYTES,
    )
    app.add_middleware(
        FrontDoor,
        engine=engine,
        inference_routes=INFERENCE_ROUTES,
        known_routes=known_routes,
        requests=m["requests"],
        seconds=m["total"],
        max_body_bytes=MAX_BODY_BYTES,
        api_key=http.api_key,
    )
    if http.cors_origins:
        # outermost: a browser's preflight (OPTIONS, no credentials) is answered here
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(http.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )

    def _checked(items: list[Text]) -> list[Text]:
        if not items:
            raise ApiError(400, "no inputs", "empty")
        for item in items:
            for text in (item,) if isinstance(item, str) else item:
                if not text.isascii():
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError as e:
                        # a JSON escape such as "\ud800" decodes to half a surrogate pair,
                        # which is no character at all: the tokenizer cannot read it
                        where = f"{e.object[e.start : e.end]!a} at character {e.start}"
                        raise ApiError(
                            400, f"text is not valid Unicode: lone surrogate {where}", "bad_request"
                        ) from None
        _check_count(len(items))
        return items

    def _check_count(n: int) -> None:
        if n > engine.config.max_inputs:
            raise ApiError(
                413, f"{n} inputs; at most {engine.config.max_inputs}", "too_many_inputs"
            )

    def _texts(inputs: str | list[str]) -> list[Text]:
        return _checked([inputs] if isinstance(inputs, str) else list(inputs))

    def _embed_inputs(inputs: Any) -> list[Text] | TokenIds:
        """Texts, or token ids: [1, 2] is one tokenized input, [[1, 2], [3]] several."""
        if isinstance(inputs, str) or not inputs or isinstance(inputs[0], str):
            return _texts(inputs)
        sequences = [inputs] if isinstance(inputs[0], int) else inputs
        _check_count(len(sequences))
        return TokenIds(sequences)

    def _predict_texts(inputs: str | list[Any]) -> list[Text]:
        """TEI's shapes: "text"; ["text", "text"] is ONE pair; a batch is a list of [text]
        or [text, text]."""
        if isinstance(inputs, str):
            return _checked([inputs])
        if not inputs:
            return _checked([])  # 400 "no inputs", as on every other route
        if all(isinstance(x, str) for x in inputs):
            if len(inputs) == 1:
                return _checked([inputs[0]])
            if len(inputs) == 2:
                return _checked([tuple(inputs)])
            raise ApiError(422, "a batch is a list of [text] or [text, text] items", "validation")
        items: list[Text] = []
        for x in inputs:
            if not isinstance(x, list) or len(x) not in (1, 2):
                raise ApiError(422, "each batch item must be [text] or [text, text]", "validation")
            items.append(x[0] if len(x) == 1 else tuple(x))
        return _checked(items)

    async def _run(
        texts: list[Text] | TokenIds, truncate: bool, per_token: bool = False
    ) -> tuple[list[torch.Tensor], int]:
        if not engine.ready:
            raise ApiError(503, "not ready" if not engine.draining else "draining", "unavailable")
        try:
            with engine.admitted() as admission:
                return await _tokenize_and_run(texts, truncate, admission, per_token)
        except OverloadedError as e:
            raise ApiError(429, str(e), "overloaded", {"Retry-After": e.retry_after}) from None

    async def _tokenize_and_run(
        texts: list[Text] | TokenIds, truncate: bool, admission: Admission, per_token: bool
    ) -> tuple[list[torch.Tensor], int]:
        t0 = time.perf_counter()
        try:
            if isinstance(texts, TokenIds):  # tokenized already: checked and framed inline
                encoded = engine.encode_ids(texts.sequences, truncate)
            elif _chars(texts) <= INLINE_TOKENIZE_CHARS:
                encoded = engine.tokenize(texts, truncate)
            else:
                encoded = await asyncio.to_thread(engine.tokenize, texts, truncate)
        except ValueError as e:
            raise ApiError(422, str(e), "validation") from None
        m["tokenize"].observe(time.perf_counter() - t0)
        tokens = sum(len(ids) for ids, _ in encoded)
        # OverloadedError: the queue's limits
        futures = engine.submit(encoded, admission, per_token=per_token)
        try:
            rows = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except DeadlineExceededError as e:
            raise ApiError(504, str(e), "timeout") from None
        except asyncio.CancelledError:  # client went away: its queued sequences never run
            for f in futures:
                f.cancel()
            raise
        return list(rows), tokens

    def _need(task: str) -> None:
        if engine.task != task:
            raise ApiError(422, f"this model serves /{engine.task}, not /{task}", "wrong_route")

    async def _embed(inputs: Any, normalize: bool | None, truncate: bool) -> Response:
        _need("embed")
        rows, _ = await _run(_embed_inputs(inputs), truncate)
        normalize = engine.normalize_default if normalize is None else normalize
        # written directly: floats from the model need no validation or encoder walk
        return _json([_vector(r, normalize) for r in rows])

    @app.post("/embed", response_model=list[list[float]])
    async def embed(body: EmbedRequest) -> Response:
        return await _embed(body.inputs, body.normalize, body.truncate)

    async def embed_fast(inputs: str | list[str], normalize: bool | None, truncate: bool) -> Any:
        try:
            return await _embed(inputs, normalize, truncate)
        except ApiError as e:
            return _error(e, "/embed")

    @app.post("/embed_all", response_model=list[list[list[float]]])
    async def embed_all(body: EmbedAllRequest) -> Response:
        """TEI's /embed_all: every token's last hidden state (special tokens included, as
        TEI returns them), not normalised, per input text."""
        _need("embed")
        rows, _ = await _run(_texts(body.inputs), body.truncate, per_token=True)
        return _json([r.numpy() for r in rows])

    @app.post("/v1/embeddings")
    async def openai_embeddings(body: OpenAIEmbeddingRequest) -> Response:
        _need("embed")
        if body.encoding_format not in ("float", "base64"):
            raise ApiError(422, "encoding_format must be 'float' or 'base64'", "validation")
        width = int(hf_config(engine.model).hidden_size)
        if body.dimensions is not None and not 1 <= body.dimensions <= width:
            raise ApiError(422, f"dimensions must be in [1, {width}] for this model", "validation")
        rows, tokens = await _run(_embed_inputs(body.input), True)
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "object": "embedding",
                        "index": i,
                        "embedding": _openai_vector(
                            r, engine.normalize_default, body.dimensions, body.encoding_format
                        ),
                    }
                    for i, r in enumerate(rows)
                ],
                "model": body.model or model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @app.post("/predict")
    async def predict(body: PredictRequest) -> list[list[dict[str, Any]]]:
        _need("predict")
        rows, _ = await _run(_predict_texts(body.inputs), body.truncate)
        labels = hf_config(engine.model).id2label or {}
        out = []
        for r in rows:
            logits: np.ndarray = r.numpy().astype(np.float64)
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            order = np.argsort(-probs, kind="stable").tolist()
            out.append([{"label": labels.get(i, str(i)), "score": float(probs[i])} for i in order])
        return out

    @app.post("/rerank")
    async def rerank(body: RerankRequest) -> list[dict[str, Any]]:
        """TEI's /rerank: each (query, text) pair through a cross-encoder (a sequence
        classifier with one output), best first; scores are sigmoid(logit) unless raw_scores."""
        _need("predict")
        labels = int(getattr(hf_config(engine.model), "num_labels", 0) or 0)
        if labels != 1:
            raise ApiError(
                422,
                f"/rerank needs a cross-encoder (a classifier with one output); this model has "
                f"{labels} labels: use /predict",
                "wrong_route",
            )
        rows, _ = await _run(_checked([(body.query, t) for t in body.texts]), body.truncate)
        logits = [float(r.reshape(-1)[0]) for r in rows]
        scores = logits if body.raw_scores else [float(1 / (1 + np.exp(-x))) for x in logits]
        out: list[dict[str, Any]] = []
        for i in sorted(range(len(scores)), key=lambda i: -scores[i]):
            out.append({"index": i, "score": scores[i]})
            if body.return_text:
                out[-1]["text"] = body.texts[i]
        return out

    @app.post("/")
    async def root(request: Request) -> Any:
        """TEI's root route (what huggingface_hub's InferenceClient posts to): /embed's body
        and answer for a base model, /predict's for a classifier."""
        try:
            payload = await request.json()
        except UnicodeDecodeError:
            raise ApiError(400, "body is not UTF-8", "bad_request") from None
        except ValueError:
            raise ApiError(422, "body is not valid JSON", "validation") from None
        try:
            if engine.task == "embed":
                body = EmbedRequest.model_validate(payload)
                return await _embed(body.inputs, body.normalize, body.truncate)
            return await predict(PredictRequest.model_validate(payload))
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        """OpenAI's model list: the one model this server runs."""
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "squant"}],
        }

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> list[list[dict[str, Any]]]:
        """TEI's shape: per input, its tokens as {id, text, special, start, stop}."""
        texts = [t for t in _texts(body.inputs) if isinstance(t, str)]
        # tokenizing is work too (a 2 MB body took seconds): admitted like inference, so a
        # flood of /tokenize is refused with 429 instead of piling up on the threads
        try:
            with engine.admitted():
                tokens = await asyncio.to_thread(
                    engine.token_details, texts, body.add_special_tokens
                )
        except OverloadedError as e:
            raise ApiError(429, str(e), "overloaded", {"Retry-After": e.retry_after}) from None
        return tokens

    @app.get("/health")
    def health() -> JSONResponse:
        # alive = the process answers and its inference workers run (before start, while
        # warming, the process is alive: /ready says whether it serves yet)
        ok = engine.healthy() or not engine.ready
        return JSONResponse({"status": "ok" if ok else "workers stopped"}, 200 if ok else 503)

    @app.get("/ready")
    def ready() -> JSONResponse:
        state = "ready" if engine.ready else ("draining" if engine.draining else "starting")
        body: dict[str, Any] = {"status": state}
        if state == "starting":  # the port opens before warm-up: say how far it got
            body["warmed_shapes"], body["shapes"] = engine.warm_shapes
        return JSONResponse(body, status_code=200 if engine.ready else 503)

    @app.get("/info")
    def info() -> dict[str, Any]:
        cfg = hf_config(engine.model)
        return {
            "model": model_name,
            "pid": os.getpid(),  # which process (replica) answered
            "model_class": engine.model_class,
            "task": engine.task,
            "max_input_length": engine.max_length,
            "buckets": list(engine.buckets),
            "instances": engine.placement.instances,
            "cores_per_instance": engine.placement.cores_per_instance,
            "quantization": record.config.to_dict()
            if (record := record_of(engine.model))
            else None,
            "labels": list((cfg.id2label or {}).values()) if engine.task == "predict" else None,
            "pooling": engine.pooling if engine.task == "embed" else None,
        }

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        m["queue"].set(engine.queue_depth())
        m["queue_s"].set(engine.queue_seconds())
        m["in_flight"].set(engine.in_flight())
        s = engine.stats
        with s.lock:
            extra = (
                f"squant_batches_total {s.batches}\n"
                f"squant_sequences_total {s.sequences}\n"
                f"squant_real_tokens_total {s.real_tokens}\n"
                f"squant_padded_tokens_total {s.padded_tokens}\n"
                f"squant_deadline_dropped_total {s.dropped_deadline}\n"
                f"squant_queue_seconds_total {s.queue_seconds}\n"
                f"squant_inference_seconds_total {s.inference_seconds}\n"
                f"squant_heap_trims_total {engine.trims}\n"
                "# HELP squant_refused_recompiles_total calls after warm-up that would have "
                "compiled; they ran eagerly instead\n"
                "# TYPE squant_refused_recompiles_total counter\n"
                f"squant_refused_recompiles_total {engine.refused_recompiles}\n"
            )
        if engine.range_monitor is not None:  # --watch-ranges: the drift alarm
            for name, r in engine.range_monitor.report().items():
                label = f'{{linear="{name}"}}'
                extra += (
                    f"squant_range_tokens_total{label} {int(r['tokens'])}\n"
                    f"squant_range_clipped_tokens_total{label} {int(r['clipped_tokens'])}\n"
                )
        return PlainTextResponse(generate_latest(registry).decode() + extra)

    known_routes.update(getattr(r, "path", "") for r in app.routes)
    return app


def _error(e: ApiError, path: str) -> JSONResponse:
    return JSONResponse(
        error_body(path, e.status, e.message, e.kind), status_code=e.status, headers=e.headers
    )


def _plain_embed_body(payload: Any) -> tuple[Any, ...] | None:
    """EmbedRequest's fields when the body has exactly their types (no coercion needed),
    else None: FastAPI then validates it and writes the documented error."""
    if not isinstance(payload, dict):
        return None
    inputs = payload.get("inputs")
    normalize = payload.get("normalize")
    truncate = payload.get("truncate", True)
    plain_inputs = isinstance(inputs, str) or (
        isinstance(inputs, list) and all(isinstance(x, str) for x in inputs)
    )
    if not plain_inputs or not isinstance(truncate, bool):
        return None
    if normalize is not None and not isinstance(normalize, bool):
        return None
    return inputs, normalize, truncate


def _chars(texts: list[Text]) -> int:
    return sum(len(t) if isinstance(t, str) else sum(map(len, t)) for t in texts)


def _json(content: Any) -> Response:
    # orjson writes numpy rows itself: a 384-float embedding took ~260 us through torch's
    # normalize, tolist and json.dumps, ~10 us this way, on the core the model runs on
    return Response(
        orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )


def _openai_vector(
    row: torch.Tensor, normalize: bool, dimensions: int | None, encoding: str
) -> np.ndarray | str:
    """OpenAI's embedding field: `dimensions` keeps the first n values and renormalises them
    (as OpenAI's shortened embeddings do); base64 is the little-endian float32 bytes."""
    vector = _vector(row, normalize)
    if dimensions is not None:
        vector = vector[:dimensions]
        if normalize:
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


def _vector(row: torch.Tensor, normalize: bool) -> np.ndarray:
    vector = row.numpy()
    if normalize:  # as torch.nn.functional.normalize: divided by max(norm, 1e-12)
        vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    return vector

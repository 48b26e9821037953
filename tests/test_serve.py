"""`squant serve`: routes, batching, admission and errors, on tiny checkpoints (no network:
FastAPI's in-process test client)."""

import concurrent.futures
import contextlib
import dataclasses
import math
import os
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
pytest.importorskip("orjson")

from fastapi.testclient import TestClient

import squant
from squant.engine.engine import Engine, OverloadedError, ServeConfig
from squant.serve.app import create_app
from tests.helpers import cosine, error_of, tiny_model, token_batches


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from squant.checkpoint.models import load_tokenizer

    return load_tokenizer(tiny_checkpoint)


def _calib(model):
    v = model.config.vocab_size
    return [
        {"input_ids": b["input_ids"] % v, "attention_mask": b["attention_mask"]}
        for b in token_batches()
    ]


@pytest.fixture(scope="module")
def embedder(tokenizer):
    model = tiny_model("bert", vocab_size=len(tokenizer), outliers=True)
    q = squant.quantize(model, calibration=_calib(model), progress=False)
    engine = Engine(q, tokenizer, ServeConfig(instances=2, cores_per_instance=1, max_inputs=8))
    engine.start()
    yield engine, TestClient(create_app(engine, "tiny"))
    engine.stop(1.0)


@pytest.fixture(scope="module")
def classifier(tiny_checkpoint, tokenizer):
    from squant.checkpoint.models import load_model

    model = load_model(tiny_checkpoint)
    q = squant.quantize(model, calibration=_calib(model), progress=False)
    engine = Engine(q, tokenizer, ServeConfig(instances=1, cores_per_instance=1))
    engine.start()
    yield engine, TestClient(create_app(engine, "tiny-cls"))
    engine.stop(1.0)


TEXTS = ["the cat sat on the mat", "a dog", "", "the red car runs fast in the park and the man"]


def _reference_embedding(engine, text):
    enc = engine.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        h = engine.model(**enc).last_hidden_state
    return h.mean(1)[0]


def test_embed_returns_each_requests_own_result(embedder):
    engine, client = embedder
    r = client.post("/embed", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    vectors = torch.tensor(r.json())
    assert vectors.shape == (len(TEXTS), 64)
    for text, got in zip(TEXTS, vectors, strict=True):
        # batched with padding to a length bucket, against the text alone, unpadded
        assert cosine(_reference_embedding(engine, text), got) >= 0.999
    single = client.post("/embed", json={"inputs": "a dog", "normalize": True}).json()
    assert len(single) == 1 and abs(float(torch.tensor(single[0]).norm()) - 1) < 1e-5


def test_openai_embeddings_shape_and_usage(embedder):
    _, client = embedder
    r = client.post("/v1/embeddings", json={"input": ["a dog", "the cat"], "model": "x"})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "list" and body["model"] == "x"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == 4 + 4  # [CLS] a dog [SEP], [CLS] the cat [SEP]


def test_predict_singles_pairs_and_labels(classifier):
    engine, client = classifier
    labels = set(engine.model.config.id2label.values())
    one = client.post("/predict", json={"inputs": "the cat sat"}).json()
    assert len(one) == 1 and {x["label"] for x in one[0]} == labels
    assert abs(sum(x["score"] for x in one[0]) - 1) < 1e-5
    assert one[0][0]["score"] >= one[0][-1]["score"]  # best first
    pair = client.post("/predict", json={"inputs": ["the cat sat", "a cat is sitting"]}).json()
    enc = engine.tokenizer(["the cat sat"], ["a cat is sitting"], return_tensors="pt")
    with torch.no_grad():
        ref = torch.softmax(engine.model(**enc).logits[0], -1)
    got = {x["label"]: x["score"] for x in pair[0]}
    for i, name in engine.model.config.id2label.items():
        assert abs(got[name] - float(ref[int(i)])) < 1e-3
    batch = client.post("/predict", json={"inputs": [["the cat"], ["a dog", "runs"]]}).json()
    assert len(batch) == 2


def test_openai_base64_and_dimensions_as_the_openai_sdk_asks_for_them(embedder):
    import base64

    engine, client = embedder
    plain = client.post("/v1/embeddings", json={"input": ["a dog", "the cat"]}).json()
    # what the openai SDK sends by default: base64 of little-endian float32
    packed = client.post(
        "/v1/embeddings", json={"input": ["a dog", "the cat"], "encoding_format": "base64"}
    ).json()
    for p, b in zip(plain["data"], packed["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(p["embedding"], dtype=np.float32))
    short = client.post("/v1/embeddings", json={"input": "a dog", "dimensions": 8}).json()
    v = np.asarray(short["data"][0]["embedding"])
    full = np.asarray(plain["data"][0]["embedding"])
    assert v.shape == (8,)
    if engine.normalize_default:  # shortened and renormalised, as OpenAI's are
        assert abs(np.linalg.norm(v) - 1) < 1e-5
        np.testing.assert_allclose(v, full[:8] / np.linalg.norm(full[:8]), rtol=1e-5)
    else:
        np.testing.assert_allclose(v, full[:8], rtol=1e-6)


def test_token_id_inputs_embed_as_their_text_with_or_without_special_tokens(embedder):
    """OpenAI's and TEI's integer-array inputs: ids of the served model's vocabulary. The ids
    a tokenizer gives with or without its special tokens both embed as the text does."""
    engine, client = embedder
    texts = ["the cat sat on the mat", "a dog", ""]
    by_text = client.post("/v1/embeddings", json={"input": texts}).json()
    bare = [engine.tokenizer.encode(t, add_special_tokens=False) for t in texts]
    framed = [engine.tokenizer(t)["input_ids"] for t in texts]
    assert framed[1][0] != bare[1][0]  # the fixture's tokenizer does add special tokens
    for ids in (bare, framed):
        got = client.post("/v1/embeddings", json={"input": ids}).json()
        assert got["usage"] == by_text["usage"]  # counted with the special tokens, as text
        for g, t in zip(got["data"], by_text["data"], strict=True):
            np.testing.assert_allclose(g["embedding"], t["embedding"], rtol=1e-5, atol=1e-6)
    one = client.post("/v1/embeddings", json={"input": bare[0]}).json()  # [id]: one input
    assert len(one["data"]) == 1
    np.testing.assert_allclose(
        one["data"][0]["embedding"], by_text["data"][0]["embedding"], rtol=1e-5, atol=1e-6
    )
    tei = client.post("/embed", json={"inputs": bare[:2]}).json()  # TEI takes ids too
    tei_text = client.post("/embed", json={"inputs": texts[:2]}).json()
    np.testing.assert_allclose(tei, tei_text, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("template", ["[CLS] $A [SEP]", "[CLS] [CLS] $A", "$A"])
def test_token_ids_are_framed_by_whatever_special_tokens_the_tokenizer_adds(
    tiny_checkpoint, template
):
    """BERT's [CLS] .. [SEP], RoBERTa's <s> .. </s>, a prefix only, none: ids with or without
    the frame become what the tokenizer makes of the text, truncated the same way."""
    from tokenizers.processors import TemplateProcessing

    from squant.checkpoint.models import load_tokenizer

    tok = load_tokenizer(tiny_checkpoint)
    tok._tokenizer.post_processor = TemplateProcessing(
        single=template, special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    engine = Engine(tiny_model("bert", vocab_size=len(tok)), tok, ServeConfig())
    texts = ["a dog", "the cat sat on the mat", "", "the red car runs fast " * 20]
    want = engine.tokenize(texts)
    bare = [tok.encode(t, add_special_tokens=False) for t in texts]
    framed = [tok(t)["input_ids"] for t in texts]
    assert engine.encode_ids(bare) == want
    assert engine.encode_ids(framed) == want


class _RecordingExecutor:
    """An executor without a model: each row is its sequence's token ids summed, and every
    padded batch it was handed is kept."""

    in_process = True
    refused_recompiles = 0

    def __init__(self):
        self.batches, self.sealed, self.closed = [], False, False

    def __call__(self, ids, mask, types, per_token=False):
        self.batches.append(ids.shape)
        return torch.from_numpy((ids * mask).sum(1, keepdims=True)).float()

    def seal(self):
        self.sealed = True

    def alive(self):
        return True

    def close(self):
        self.closed = True


def test_the_engine_batches_for_any_executor_without_a_model(tokenizer):
    """The seam: admission, buckets and workers run on an executor that is no model at all
    (a model process is one too); the engine only reads the model's description."""
    from squant.engine.model_process import ModelDescription

    description = ModelDescription(
        "BertModel",
        tiny_model("bert", vocab_size=len(tokenizer)).config,
        ("input_ids", "attention_mask", "token_type_ids"),
        64,
        None,
    )
    executor = _RecordingExecutor()
    config = ServeConfig(instances=1, cores_per_instance=1, buckets=(8, 32))
    engine = Engine(description, tokenizer, config, executor=executor)
    assert engine.runner is None  # nothing runs in the engine itself
    engine.start()
    assert executor.sealed  # after warm-up, every bucket at batch 1 and its largest
    assert {width for _, width in executor.batches} == {8, 32, 64}
    client = TestClient(create_app(engine, "fake"))
    texts = ["a dog", "the cat sat on the mat " * 4]
    rows = client.post("/embed", json={"inputs": texts}).json()
    want = [sum(ids) for ids, _ in engine.tokenize(texts)]
    assert [r[0] for r in rows] == want
    assert executor.batches[-1][1] in (8, 32)  # a bucket's width, not the model's limit
    engine.stop(1.0)
    assert executor.closed


def test_over_long_token_ids_are_truncated_like_text_or_refused(embedder):
    engine, client = embedder
    text = "the red car runs fast " * 40
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > engine.max_length
    by_text = client.post("/embed", json={"inputs": text}).json()
    by_ids = client.post("/embed", json={"inputs": [ids]}).json()
    np.testing.assert_allclose(by_ids, by_text, rtol=1e-5, atol=1e-6)
    refused = client.post("/embed", json={"inputs": [ids], "truncate": False})
    assert refused.status_code == 422 and "exceeds" in refused.json()["error"]


def test_the_openai_sdk_sends_token_ids_and_gets_the_texts_embedding(embedder):
    openai = pytest.importorskip("openai")
    engine, client = embedder
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    ids = engine.tokenizer.encode("a dog", add_special_tokens=False)
    got = sdk.embeddings.create(input=[ids], model="squant")
    plain = client.post("/v1/embeddings", json={"input": "a dog"}).json()
    np.testing.assert_allclose(got.data[0].embedding, plain["data"][0]["embedding"], rtol=1e-5)


def test_openai_routes_answer_errors_in_openais_shape_tei_routes_in_teis(embedder):
    """The openai SDK reads OpenAI's error object into its exception: message, code, type."""
    openai = pytest.importorskip("openai")
    _, client = embedder
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        sdk.embeddings.create(input="a", model="m", dimensions=100_000)
    assert caught.value.code == "validation" and caught.value.type == "invalid_request_error"
    assert "dimensions must be in [1, 64]" in caught.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.code == "not_found"
    tei = client.post("/embed", json={"inputs": []}).json()
    assert tei == {"error": "no inputs", "error_type": "empty"}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"input": [1, 10**6]}, 422, "outside this model's vocabulary"),
        ({"input": [[5], [-1]]}, 422, "input 1: token id -1"),
        ({"input": [True, 5]}, 422, ""),  # a bool is not a token id
        ({"input": [1.0, 5]}, 422, ""),
        ({"input": ["a", 5]}, 422, ""),  # texts and ids do not mix
        ({"input": [[1]] * 9}, 413, "at most 8"),
    ],
)
def test_bad_token_ids_are_refused_with_the_reason(embedder, body, status, message):
    _, client = embedder
    r = client.post("/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    assert message in error_of(r)[0]


@pytest.mark.parametrize(
    ("route", "body", "status", "kind"),
    [
        ("/embed", {"inputs": []}, 400, "empty"),
        ("/embed", {"inputs": ["a"] * 9}, 413, "too_many_inputs"),
        ("/embed", {"inputs": 5}, 422, "validation"),
        ("/embed", {"nothing": 1}, 422, "validation"),
        ("/embed", {"inputs": "word " * 100, "truncate": False}, 422, "validation"),
        ("/predict", {"inputs": "a"}, 422, "wrong_route"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, 422, "validation"),
        ("/v1/embeddings", {"input": "a", "dimensions": 0}, 422, "validation"),
        ("/v1/embeddings", {"input": "a", "dimensions": 100_000}, 422, "validation"),
    ],
)
def test_bad_requests_get_their_documented_status(embedder, route, body, status, kind):
    _, client = embedder
    r = client.post(route, json=body)
    assert r.status_code == status, r.text
    message, got_kind = error_of(r)
    assert got_kind == kind and message


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/embed", '{"inputs": "a \\ud800 b"}'),
        ("/embed", '{"inputs": ["fine", "\\udfff"]}'),
        ("/v1/embeddings", '{"input": "\\ud800"}'),
        ("/tokenize", '{"inputs": "x\\ud800"}'),
        ("/predict", '{"inputs": ["a", "\\ud800"]}'),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_it_not_a_500(embedder, classifier, route, body):
    _, client = classifier if route == "/predict" else embedder
    r = client.post(route, content=body.encode(), headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    message, kind = error_of(r)
    assert "surrogate" in message and kind == "bad_request"


def test_malformed_bodies_and_unknown_routes(embedder):
    _, client = embedder
    assert (
        client.post(
            "/embed", content=b"{not json", headers={"content-type": "application/json"}
        ).status_code
        == 422
    )
    bad_utf8 = client.post(
        "/embed", content=b'{"inputs": "\xff\xfe"}', headers={"content-type": "application/json"}
    )
    assert bad_utf8.status_code == 400 and bad_utf8.json()["error_type"] == "bad_request"
    assert client.post("/embed", content=b"x" * (3 * 2**20)).status_code == 413
    assert client.get("/nowhere").json()["error_type"] == "not_found"
    long = client.post("/embed", json={"inputs": "word " * 100_000})  # truncated by default
    assert long.status_code == 200
    assert client.post("/embed", json={"inputs": "still serving"}).status_code == 200


def test_full_queue_is_429_with_retry_after(tokenizer):
    model = tiny_model("bert", vocab_size=len(tokenizer))
    engine = Engine(model, tokenizer, ServeConfig(instances=1, cores_per_instance=1, max_queue=2))
    engine.ready = True  # workers not started: the queue only fills
    client = TestClient(create_app(engine))
    engine.submit(engine.tokenize(["a", "b"]))
    r = client.post("/embed", json={"inputs": "c"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    with pytest.raises(OverloadedError):
        engine.submit(engine.tokenize(["d"]))


def test_queued_work_over_max_queue_ms_is_429_with_its_wait(tokenizer):
    """Admission by time: with a measured speed of 1,000 padded tokens/s, 16-token sequences
    queue 16 ms each; past max_queue_ms (50) requests are refused with Retry-After >= wait,
    long before the count limit, and an empty queue always admits."""
    model = tiny_model("bert", vocab_size=len(tokenizer))
    config = ServeConfig(instances=1, cores_per_instance=1, max_queue=1000, max_queue_ms=50)
    engine = Engine(model, tokenizer, config)
    engine.ready = True  # workers not started: the queue only fills
    engine.queue._tokens_per_s = 1000.0
    admitted = 0
    while True:
        try:
            engine.submit(engine.tokenize(["a"]))  # 16-token bucket
        except OverloadedError as e:
            refused = e
            break
        admitted += 1
        assert admitted < 20, "never refused"
    assert engine.queue_depth() == admitted == 4  # 4 x 16 ms = 64 ms > 50 ms: the 5th is refused
    assert engine.queue_seconds() == pytest.approx(0.064)
    assert refused.retry_after_s == pytest.approx(0.064)
    r = TestClient(create_app(engine)).post("/embed", json={"inputs": "a"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error_type"] == "overloaded"
    # the same check runs before any tokenizing, for the request's whole life
    with pytest.raises(OverloadedError, match="of work queued"), engine.admitted():
        pass
    engine.queue._tokens_per_s = 1e9  # a fast engine: the queue is no obstacle any more
    with engine.admitted(), engine.admitted():  # two in flight
        pass
    small = Engine(
        model, tokenizer, ServeConfig(instances=1, cores_per_instance=1, max_concurrent=1)
    )
    with (
        small.admitted(),
        pytest.raises(OverloadedError, match="1 requests in flight"),
        small.admitted(),
    ):
        pass
    with small.admitted():  # released when the first finished
        pass
    # the same queue with the time limit off admits up to the count limit
    assert ServeConfig(max_queue_ms=0).max_queue_ms == 0
    with pytest.raises(squant.SquantError, match="max_queue_ms"):
        ServeConfig(max_queue_ms=-1)
    with pytest.raises(squant.SquantError, match="malloc_arenas"):
        ServeConfig(malloc_arenas=-1)


def test_admitted_requests_still_tokenizing_count_as_queued_work(tokenizer):
    """A burst can admit many requests while the queue is still short; until they queue
    their sequences they count at the average request's size, so admission closes when the
    work on its way exceeds max_queue_ms, not only the work already queued."""
    import contextlib

    model = tiny_model("bert", vocab_size=len(tokenizer))
    config = ServeConfig(instances=1, cores_per_instance=1, max_queue=1000, max_queue_ms=50)
    engine = Engine(model, tokenizer, config)
    engine.queue._tokens_per_s = 1000.0  # 16 ms per 16-token request
    with engine.admitted() as first:
        engine.submit(engine.tokenize(["a"]), first)  # the average request: 16 tokens
    engine.queue._queue.clear()
    engine.queue._queued_tokens = 0
    assert engine.queue_seconds() == 0.0
    with contextlib.ExitStack() as stack:
        held = []
        while len(held) < 4:
            held.append(stack.enter_context(engine.admitted()))
        with pytest.raises(OverloadedError, match="of work queued"):
            stack.enter_context(engine.admitted())
        assert len(held) == 4  # 3 on the way = 48 ms admits a 4th; 64 ms refuses the 5th
        assert engine.queue_seconds() == pytest.approx(0.064)
        engine.submit(engine.tokenize(["a"]), held[0])  # queued: counted by its real size
        assert engine.queue_seconds() == pytest.approx(0.064)
        with pytest.raises(OverloadedError):  # still 64 ms > 50 ms: its second submit waits
            engine.submit(engine.tokenize(["a"]), held[0])
        assert engine.queue._unqueued == 3  # and did not count it off twice
    assert engine.queue._unqueued == 0 and engine.in_flight() == 0  # all released on the way out


def test_overload_is_refused_at_the_front_door_before_the_body_is_read(tokenizer, monkeypatch):
    """While the queue is over its time limit, inference routes answer 429 from the headers
    alone: a body that would be a 422 (not JSON) is never read, and neither tokenizing nor
    validation runs. Other routes, and the same request once the queue drains, are served."""
    model = tiny_model("bert", vocab_size=len(tokenizer))
    config = ServeConfig(instances=1, cores_per_instance=1, max_queue=1000, max_queue_ms=50)
    engine = Engine(model, tokenizer, config)
    engine.ready = True  # workers not started: the queue only fills
    engine.queue._tokens_per_s = 1000.0
    client = TestClient(create_app(engine))
    for _ in range(4):
        engine.submit(engine.tokenize(["a"]))  # 64 ms of work queued: over the 50 ms limit
    assert engine.refusal() is not None
    tokenized = []
    monkeypatch.setattr(engine, "tokenize", lambda *a, **k: tokenized.append(a))
    for route in ("/embed", "/v1/embeddings", "/predict"):
        r = client.post(route, content=b"{not json")
        assert r.status_code == 429, (route, r.text)
        assert error_of(r)[1] == "overloaded" and r.headers["retry-after"] == "1"
    assert tokenized == []
    assert client.post("/tokenize", content=b"{not json").status_code == 422  # not queued work
    assert client.get("/ready").status_code == 200
    engine.queue._queue.clear()
    engine.queue._queued_tokens = 0
    assert engine.refusal() is None
    assert client.post("/embed", content=b"{not json").status_code == 422  # parsed again
    text = client.get("/metrics").text
    assert 'squant_requests_total{route="/embed",status="429"} 1.0' in text
    client.get("/no/such/route/1")
    client.get("/no/such/route/2")
    text = client.get("/metrics").text
    assert 'route="unmatched",status="404"} 2.0' in text  # one label for every unknown path
    assert "/no/such/route" not in text


@pytest.mark.parametrize("max_wait_ms", [1000.0, 0.0])
def test_max_wait_ms_lets_a_short_batch_fill(tokenizer, max_wait_ms):
    """One sequence arrives, three more of its bucket 50 ms later: with a wait they join its
    batch (one batch of 4); without, the first runs alone at once."""
    import time

    model = tiny_model("bert", vocab_size=len(tokenizer))
    config = ServeConfig(
        instances=1, cores_per_instance=1, max_batch_requests=4, max_wait_ms=max_wait_ms
    )
    engine = Engine(model, tokenizer, config)
    engine.start(warm=False)
    try:
        first = engine.submit(engine.tokenize(["a b"]))
        time.sleep(0.05)
        rest = engine.submit(engine.tokenize(["c d", "e", "f g h"]))
        for f in first + rest:
            f.result(timeout=30)
        assert engine.stats.sequences == 4
        assert engine.stats.batches == (1 if max_wait_ms else 2)
    finally:
        engine.stop(1.0)
    for bad in (-1, float("nan"), float("inf")):  # a wait must end
        with pytest.raises(squant.SquantError, match="max_wait_ms"):
            ServeConfig(max_wait_ms=bad)


@pytest.mark.parametrize("idle_trim_s", [0.05, 0.0])
def test_an_idle_engine_trims_its_heap_once_after_work(tokenizer, idle_trim_s):
    import time

    model = tiny_model("bert", vocab_size=len(tokenizer))
    config = ServeConfig(
        instances=1, cores_per_instance=1, idle_trim_s=idle_trim_s, trim_interval_s=0
    )
    engine = Engine(model, tokenizer, config)
    engine.start(warm=False)
    try:

        def run_one():
            for f in engine.submit(engine.tokenize(["a few words"])):
                f.result(timeout=30)

        run_one()
        time.sleep(0.4)  # idle 8x longer than idle_trim_s: one trim, not one per wait
        assert engine.trims == (1 if idle_trim_s else 0)
        run_one()  # the worker still serves after trimming (or after idle waits without)
        time.sleep(0.4)
        assert engine.trims == (2 if idle_trim_s else 0)
        assert engine.healthy()
    finally:
        engine.stop(1.0)
    with pytest.raises(squant.SquantError, match="idle_trim_s"):
        ServeConfig(idle_trim_s=-1)


def test_a_busy_engine_also_trims_when_its_queue_runs_empty_at_most_every_interval(tokenizer):
    """Under steady traffic idle spells are rare: the heap is also trimmed when the queue runs
    empty after work, once trim_interval_s has passed since the last trim (idle trim off)."""
    import time

    model = tiny_model("bert", vocab_size=len(tokenizer))
    config = ServeConfig(instances=1, cores_per_instance=1, idle_trim_s=0, trim_interval_s=0.3)
    engine = Engine(model, tokenizer, config)
    engine.start(warm=False)

    def run_one():
        for f in engine.submit(engine.tokenize(["a few words"])):
            f.result(timeout=30)

    try:
        time.sleep(0.35)  # the interval since start has passed
        run_one()
        time.sleep(0.1)
        assert engine.trims == 1  # queue empty after work, interval passed: at once
        run_one()
        time.sleep(0.1)
        assert engine.trims == 1  # 0.1 s since the last trim: not yet
        time.sleep(0.8)
        assert engine.trims == 2  # the next wake-up after the interval
        time.sleep(0.6)
        assert engine.trims == 2  # nothing ran since: no more
        assert engine.healthy()
    finally:
        engine.stop(1.0)
    with pytest.raises(squant.SquantError, match="trim_interval_s"):
        ServeConfig(trim_interval_s=-1)


def test_ready_health_info_metrics(tokenizer, embedder):
    model = tiny_model("bert", vocab_size=len(tokenizer))
    cold = Engine(model, tokenizer, ServeConfig(instances=1, cores_per_instance=1))
    client = TestClient(create_app(cold))
    assert client.get("/health").status_code == 200
    assert client.get("/ready").status_code == 503  # not warmed yet
    assert client.post("/embed", json={"inputs": "a"}).status_code == 503
    engine, warm = embedder
    assert warm.get("/ready").status_code == 200
    info = warm.get("/info").json()
    assert info["task"] == "embed" and info["buckets"][-1] == 64
    warm.post("/embed", json={"inputs": ["a", "b c"]})
    text = warm.get("/metrics").text
    assert 'squant_requests_total{route="/embed",status="200"}' in text
    assert "squant_padded_tokens_total" in text and engine.stats.sequences >= 2


def test_health_fails_when_a_worker_has_died(tokenizer):
    import time

    def fatal(**_inputs):
        raise SystemExit  # not an Exception: it ends the worker thread, as a crash would

    model = tiny_model("bert", vocab_size=len(tokenizer))
    engine = Engine(model, tokenizer, ServeConfig(instances=1, cores_per_instance=1), runner=fatal)
    engine.start(warm=False)
    client = TestClient(create_app(engine))
    assert engine.healthy() and client.get("/health").status_code == 200
    engine.submit(engine.tokenize(["a"]))
    deadline = time.time() + 10
    while engine.healthy() and time.time() < deadline:
        time.sleep(0.05)
    assert not engine.healthy()
    r = client.get("/health")
    assert r.status_code == 503 and r.json()["status"] == "workers stopped"


@pytest.mark.slow  # ~35 s; the runner squant serve builds itself is tested below
@pytest.mark.compile
def test_compiled_runner_serves_every_bucket(tokenizer):
    """One squant.compile graph with dynamic shapes serves all buckets and batch sizes."""
    model = tiny_model("bert", vocab_size=len(tokenizer), outliers=True)
    q = squant.quantize(model, calibration=_calib(model), progress=False)
    compiled = squant.compile(q, squant.CompileConfig(dynamic=True, float_dtype="fp32"))
    config = ServeConfig(instances=1, cores_per_instance=1, buckets=(16,), max_batch_requests=4)
    engine = Engine(q, tokenizer, config, runner=compiled)
    engine.start()  # warms buckets 16 and 64
    try:
        client = TestClient(create_app(engine))
        texts = ["a dog", "the cat sat on the mat " * 4, "the red car"]
        got = torch.tensor(client.post("/embed", json={"inputs": texts}).json())
        for text, row in zip(texts, got, strict=True):
            assert cosine(_reference_embedding(engine, text), row) >= 0.999
    finally:
        engine.stop(1.0)


def test_serve_command_bad_input_is_one_line(tiny_checkpoint, tmp_path, capsys):
    import socket

    from squant.cli import main

    def error(args):
        code = main(["serve", *args])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("squant serve: error:") and "\n" not in err, err
        return err

    assert "does not exist" in error([str(tmp_path / "missing"), "--port", "18999"])
    pooling = ["--pooling-from", str(tmp_path / "x"), "--port", "18998"]
    assert "--pooling-from" in error([str(tiny_checkpoint), *pooling])
    assert "--port" in error([str(tiny_checkpoint), "--port", "0"])
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        assert "cannot listen on 127.0.0.1:" in error([str(tiny_checkpoint), "--port", port])
    # a host that cannot be encoded (a stray byte from the shell) is an error, not a traceback
    bad_host = [str(tiny_checkpoint), "--host", "\udcff", "--port", "18997"]
    assert "is not a host name or address" in error(bad_host)


def test_serve_builds_its_engine_from_a_deploy_directory(deploy_dir):
    """`squant serve DEPLOY`: the exported package runs the batches, padded to its exported
    batch; each request still gets its own result."""
    import argparse

    from squant.checkpoint.models import load_tokenizer
    from squant.commands.serve import add_arguments, build_engine

    quantized, deploy = deploy_dir
    q, tok = squant.load(quantized), load_tokenizer(deploy)
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # the command's own parser: its defaults, as a user gets them
    args = parser.parse_args([str(deploy), "--instances", "2", "--cores-per-instance", "1"])
    engine = build_engine(args)
    assert engine.task == "predict"  # the package's class has a head
    assert engine.config.max_batch_requests == 2  # never more than the package's batch
    engine.start()
    try:
        client = TestClient(create_app(engine, "deploy"))
        texts = [["the cat sat", "a dog runs"], ["a man", "the park is big"], ["red", "blue"]]
        r = client.post("/predict", json={"inputs": texts})
        assert r.status_code == 200, r.text
        for pair, got in zip(texts, r.json(), strict=True):
            enc = tok(*pair, return_tensors="pt")
            with torch.no_grad():
                ref = torch.softmax(q(**enc).logits[0], -1)
            scores = {d["label"]: d["score"] for d in got}
            for i, p in enumerate(ref.tolist()):
                assert abs(scores[q.config.id2label[i]] - p) < 1e-3
    finally:
        engine.stop(1.0)


def test_malloc_arenas_are_capped_on_glibc():
    import platform

    from squant.engine.process_memory import limit_malloc_arenas

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt(M_ARENA_MAX) is glibc's")
    assert limit_malloc_arenas(8) is True  # glibc's own default scale: harmless to the suite


def test_startup_objects_are_frozen_and_new_garbage_is_still_collected():
    import gc
    import weakref

    from squant.engine.process_memory import freeze_startup_objects

    class Node:
        pass

    try:
        kept = Node()
        assert freeze_startup_objects() > 0
        assert not gc.is_tracked(kept) or kept not in gc.get_objects()  # out of the GC's sight
        cycle = Node()
        cycle.me = cycle  # a reference cycle made after the freeze: only the GC frees it
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # the rest of the suite runs with the usual collector


def test_a_float_checkpoint_is_quantized_at_start_up_with_calib(
    tiny_checkpoint, calib_jsonl, deploy_dir, tmp_path
):
    import argparse

    from squant.commands.serve import add_arguments, build_engine
    from squant.quant.qlinear import QuantLinear

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # eager: what is checked here is the quantization at start-up (compiling: tests below)
    layout = ["--instances", "1", "--cores-per-instance", "1", "--runtime", "eager"]
    layout += ["--model-process", "off"]  # the model itself is inspected here
    args = parser.parse_args([str(tiny_checkpoint), *layout, "--calib", str(calib_jsonl)])
    engine = build_engine(args)
    assert any(isinstance(m, QuantLinear) for m in engine.model.modules())
    assert engine.quantize_report is not None and engine.quantize_report.linears > 0
    assert engine.task == "predict"
    plain = build_engine(parser.parse_args([str(tiny_checkpoint), *layout]))
    assert not any(isinstance(m, QuantLinear) for m in plain.model.modules())  # FP32
    quantized, _ = deploy_dir
    args = parser.parse_args([str(quantized), *layout, "--calib", str(calib_jsonl)])
    with pytest.raises(squant.SquantError, match="already quantized"):
        build_engine(args)


def test_watch_ranges_counts_every_real_token_of_every_static_linear(tokenizer):
    model = tiny_model("bert", vocab_size=len(tokenizer), outliers=True)
    q = squant.quantize(model, calibration=_calib(model), progress=False)
    static = {n: m for n, m in q.named_modules() if getattr(m, "mode", None) == "static"}
    narrowed = next(iter(static))
    with torch.no_grad():  # a range 100x too narrow: that linear must report clipping
        static[narrowed].input_scale.div_(100.0)
    static[narrowed].refresh()
    config = ServeConfig(instances=2, cores_per_instance=1, watch_ranges=True)
    engine = Engine(q, tokenizer, config)
    engine.start(warm=False)
    try:
        client = TestClient(create_app(engine))
        texts = ["the cat sat on the mat", "a dog", "the red car runs fast in the park"]
        for text in texts:
            assert client.post("/embed", json={"inputs": [text, text]}).status_code == 200
        real = 2 * sum(len(tokenizer(t)["input_ids"]) for t in texts)  # padding not counted
        report = engine.range_monitor.report()
        assert set(report) == set(static)
        assert all(r["tokens"] == real for r in report.values())
        assert report[narrowed]["clipped_tokens"] > 0
        metrics = client.get("/metrics").text
        assert f'squant_range_tokens_total{{linear="{narrowed}"}} {real}' in metrics
        assert f'squant_range_clipped_tokens_total{{linear="{narrowed}"}}' in metrics
    finally:
        engine.stop(1.0)
    dynamic = squant.quantize(
        model, squant.SmoothQuantConfig(mode="dynamic"), _calib(model), progress=False
    )
    with pytest.raises(squant.SquantError, match="no static int8 linears"):
        Engine(dynamic, tokenizer, ServeConfig(watch_ranges=True))


class _FakeCompiled(torch.nn.Module):
    """What squant.compile returns, as far as the engine is concerned: .model and a call."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **inputs):
        return self.model(**inputs)


def test_compiled_runtime_compiles_at_the_workers_thread_count(
    base_dir, tiny_checkpoint, monkeypatch
):
    from squant.engine.loading import engine_for

    calls = []

    def fake_compile(model, config, example_inputs):
        calls.append((torch.get_num_threads(), config, example_inputs["attention_mask"]))
        return _FakeCompiled(model)

    monkeypatch.setattr("squant.runtime.compiler.compile", fake_compile)
    before = torch.get_num_threads()
    # (by default, "auto", a quantized directory is served from its cached package:
    # test_package_cache.py)
    compiled = ServeConfig(instances=1, cores_per_instance=1, runtime="compiled")
    engine = engine_for(base_dir, compiled)
    assert isinstance(engine.runner, _FakeCompiled) and engine.runner.model is engine.model
    ((threads, compile_config, mask),) = calls
    # compiled at the workers' thread count (dynamo guards it), for every shape, with the C++
    # wrapper (its call releases the GIL: the front end keeps running beside it), and checked
    # on a padded batch (real padding is where a compile was refused before)
    assert (threads, compile_config.dynamic, compile_config.cpp_wrapper) == (1, True, True)
    assert not bool(mask.all())
    assert torch.get_num_threads() == before  # the caller's setting is restored
    # attention: timed per process unless named (two processes may time their way apart)
    assert compile_config.attention == "auto"
    engine_for(base_dir, dataclasses.replace(compiled, attention="squant"))
    assert calls[-1][1].attention == "squant"
    calls.pop()
    with pytest.raises(squant.SquantError, match="attention must be one of"):
        ServeConfig(attention="flash")
    for runtime, config in [
        ("eager", ServeConfig(runtime="eager")),
        ("auto with watch_ranges", ServeConfig(watch_ranges=True, runtime="auto")),
    ]:
        engine = engine_for(base_dir, config)
        assert not isinstance(engine.runner, _FakeCompiled), runtime
    plain = engine_for(tiny_checkpoint, ServeConfig(runtime="auto"))  # float: as it is, eager
    assert plain.runner is plain.model and len(calls) == 1
    with pytest.raises(squant.SquantError, match="--runtime eager"):
        engine_for(base_dir, ServeConfig(runtime="compiled", watch_ranges=True))
    with pytest.raises(squant.SquantError, match="runtime must be one of"):
        ServeConfig(runtime="jit")


def test_a_failed_compile_serves_eagerly_unless_compiled_was_asked_for(base_dir, monkeypatch):
    from squant.embed.local import offline_config  # bulk embedding compiles by default
    from squant.engine.loading import engine_for

    def broken(model, config, example_inputs):
        raise RuntimeError("InductorError: no C++ compiler found\nlong traceback")

    monkeypatch.setattr("squant.runtime.compiler.compile", broken)
    config = offline_config(instances=1, cores_per_instance=1)
    # no package could be built (engine/package_cache.py), so "auto" compiles, which fails too
    monkeypatch.setattr("squant.engine.local_engine.packaged_model", lambda *a: None)
    with pytest.warns(UserWarning, match=r"serving eagerly: .*no C\+\+ compiler found"):
        engine = engine_for(base_dir, config)
    assert engine.runner is engine.model
    with pytest.raises(squant.SquantError, match=r"--runtime compiled: .*no C\+\+ compiler"):
        engine_for(base_dir, ServeConfig(runtime="compiled"))


@pytest.mark.slow  # ~60 s: a real compile
@pytest.mark.compile
def test_the_compiled_runner_serves_two_instances_without_recompiling(base_dir):
    from torch._dynamo.utils import counters

    from squant.engine.loading import engine_for

    config = ServeConfig(
        instances=2, cores_per_instance=1, max_batch_requests=4, runtime="compiled"
    )
    engine = engine_for(base_dir, config)
    assert type(engine.runner).__name__ == "CompiledEncoder"
    engine.start()  # every bucket at batch 1 and its largest batch
    graphs = counters["stats"]["unique_graphs"]
    try:
        client = TestClient(create_app(engine))
        texts = ["a dog", "the cat sat on the mat " * 4, "the red car", "", "red car " * 20]
        bodies = [{"inputs": texts[: k + 1]} for k in range(len(texts))] * 3
        with concurrent.futures.ThreadPoolExecutor(6) as pool:  # both workers busy
            answers = list(pool.map(lambda b: client.post("/embed", json=b), bodies))
        assert all(r.status_code == 200 for r in answers)
        got = torch.tensor(answers[len(texts) - 1].json())
        for text, row in zip(texts, got, strict=True):
            assert cosine(_reference_embedding(engine, text), row) >= 0.999
    finally:
        engine.stop(1.0)
    # traffic on worker threads, across buckets and batch sizes, built no new graph
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two cores",
)
def test_the_front_end_moves_off_the_instances_cores():
    from squant.runtime.placement import Placement, pin_front_end

    cores = sorted(os.sched_getaffinity(0))
    seen: dict[str, Any] = {}

    def in_a_thread():  # affinity is per thread: keep pytest's own thread as it is
        seen["spare"] = pin_front_end(Placement(1, 1, ((cores[0],),)))
        seen["now"] = os.sched_getaffinity(0)
        child = threading.Thread(target=lambda: seen.setdefault("child", os.sched_getaffinity(0)))
        child.start()
        child.join()
        seen["none_left"] = pin_front_end(Placement(1, len(cores), (tuple(cores),)))

    t = threading.Thread(target=in_a_thread)
    t.start()
    t.join()
    assert seen["spare"] == tuple(cores[1:])
    assert seen["now"] == seen["child"] == set(cores[1:])  # threads started later inherit it
    assert seen["none_left"] == ()
    assert os.sched_getaffinity(0) == set(cores)


@pytest.mark.compile
def test_after_ready_no_shape_compiles_mixed_batches_and_lengths_run_on_warm_graphs(base_dir):
    """Every batch size 1..max and every length 1..max after start(): no compile happens (a
    sealed runner would run such a call eagerly and count it), answers stay right."""
    from squant.engine.loading import engine_for

    config = ServeConfig(
        instances=1,
        cores_per_instance=1,
        max_batch_requests=4,
        runtime="compiled",
        buckets=(16, 32),
    )
    engine = engine_for(base_dir, config)
    engine.start()
    try:
        assert engine.runner.sealed
        client = TestClient(create_app(engine))
        rng = np.random.default_rng(0)
        for n in range(1, 5):
            for _ in range(6):
                words = rng.integers(0, 40, size=n)
                texts = [" ".join(["cat"] * int(w)) for w in words]
                assert client.post("/embed", json={"inputs": texts}).status_code == 200
        assert engine.refused_recompiles == 0, "a shape after ready was not warm"
        metrics = client.get("/metrics").text
        assert "squant_refused_recompiles_total 0" in metrics
        # a shape the engine never sends (one token wide: dynamo specializes sizes of 1) is
        # not compiled: it runs eagerly, gives the eager answer, and is counted
        ids = np.full((3, 1), 5, dtype=np.int64)
        rows = engine.executor(ids, np.ones_like(ids), np.zeros_like(ids))
        assert engine.refused_recompiles == 1
        with torch.no_grad():
            ref = engine.model(input_ids=torch.from_numpy(ids)).last_hidden_state[:, 0]
        torch.testing.assert_close(rows, ref.float(), atol=1e-4, rtol=1e-4)
    finally:
        engine.stop(1.0)


def test_the_openai_sdk_with_its_default_settings_gets_the_served_embeddings(embedder):
    openai = pytest.importorskip("openai")
    _, client = embedder
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client)
    got = sdk.embeddings.create(input=["a dog", "the cat"], model="squant")  # base64 by default
    plain = client.post("/v1/embeddings", json={"input": ["a dog", "the cat"]}).json()
    for g, p in zip(got.data, plain["data"], strict=True):
        np.testing.assert_allclose(np.asarray(g.embedding), p["embedding"], rtol=1e-6)
    assert got.usage.total_tokens > 0


def test_langchain_openai_embeddings_get_the_served_embeddings(embedder):
    """LangChain's OpenAIEmbeddings as its docs set it up for servers other than OpenAI's:
    check_embedding_ctx_length=False, or it pre-tokenizes with OpenAI's tiktoken and sends
    OpenAI token ids (meaningless to another model's vocabulary). Base64 as by default."""
    lc = pytest.importorskip("langchain_openai")
    _, client = embedder
    embeddings = lc.OpenAIEmbeddings(
        model="squant",
        base_url="http://testserver/v1",
        api_key="unused",
        http_client=client,
        check_embedding_ctx_length=False,
    )
    texts = ["a dog", "the cat sat on the mat"]
    got = embeddings.embed_documents(texts)
    plain = client.post("/v1/embeddings", json={"input": texts}).json()
    for g, p in zip(got, plain["data"], strict=True):
        np.testing.assert_allclose(np.asarray(g), p["embedding"], rtol=1e-6)
    query = embeddings.embed_query("a dog")
    np.testing.assert_allclose(np.asarray(query), plain["data"][0]["embedding"], rtol=1e-6)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_queue_ms", float("nan"), "max_queue_ms must be a finite number"),
        ("max_queue_ms", float("inf"), "max_queue_ms must be a finite number"),
        ("malloc_arenas", 10**11, r"malloc_arenas must be in \[0, 4096\]"),
    ],
)
def test_nonsense_serve_settings_are_refused(field, value, message):
    with pytest.raises(squant.SquantError, match=message):
        ServeConfig(**{field: value})


def test_an_empty_predict_batch_is_400_like_every_route(classifier):
    _, client = classifier
    r = client.post("/predict", json={"inputs": []})
    assert r.status_code == 400 and r.json()["error_type"] == "empty"


def test_tokenize_is_admitted_like_inference(tokenizer):
    """/tokenize does work too: with every admission slot held it is refused with 429."""
    import contextlib

    model = tiny_model("bert", vocab_size=len(tokenizer))
    engine = Engine(
        model, tokenizer, ServeConfig(instances=1, cores_per_instance=1, max_concurrent=2)
    )
    engine.ready = True
    client = TestClient(create_app(engine))
    assert client.post("/tokenize", json={"inputs": "a cat"}).status_code == 200
    with contextlib.ExitStack() as stack:
        for _ in range(2):
            stack.enter_context(engine.admitted())
        r = client.post("/tokenize", json={"inputs": "a cat"})
        assert r.status_code == 429 and r.json()["error_type"] == "overloaded"
    assert client.post("/tokenize", json={"inputs": "a cat"}).status_code == 200


def test_tei_root_route_and_openai_model_list(embedder, classifier):
    _, client = embedder
    root = client.post("/", json={"inputs": ["a dog", "the cat"]})
    assert root.status_code == 200
    assert root.json() == client.post("/embed", json={"inputs": ["a dog", "the cat"]}).json()
    assert client.post("/", json={"inputs": 5}).status_code == 422
    assert (
        client.post("/", content=b"{bad", headers={"content-type": "application/json"}).status_code
        == 422
    )
    assert client.post("/", json={"inputs": []}).json()["error_type"] == "empty"
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    _, cls_client = classifier
    pair = {"inputs": ["the cat sat", "a cat is sitting"]}
    assert cls_client.post("/", json=pair).json() == cls_client.post("/predict", json=pair).json()


@contextlib.contextmanager
def _live(app):
    """The app on a loopback port (clients that build their own HTTP connections)."""
    import socket
    import time

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.time() + 10
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)


def test_huggingface_hub_inference_client_with_its_defaults(embedder, classifier, monkeypatch):
    """huggingface_hub's InferenceClient(base_url) POSTs to "/" (TEI): feature_extraction
    against a base model, text_classification against a classifier."""
    hub = pytest.importorskip("huggingface_hub")
    # either variable puts huggingface_hub offline, and it then refuses even loopback URLs
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _, client = embedder
    with _live(client.app) as url:
        got = hub.InferenceClient(base_url=url).feature_extraction("a dog")
    want = client.post("/embed", json={"inputs": "a dog"}).json()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    _, cls_client = classifier
    with _live(cls_client.app) as url:
        labels = hub.InferenceClient(base_url=url).text_classification("the cat sat")
    want = cls_client.post("/predict", json={"inputs": "the cat sat"}).json()[0]
    assert [(x.label, x.score) for x in labels] == [(x["label"], x["score"]) for x in want]


@pytest.fixture(scope="module")
def guarded(embedder):
    """The embedder's engine behind an API key, a CORS allow-list and a served name."""
    from squant.serve.app import HttpConfig

    engine, _ = embedder
    http = HttpConfig(
        model_name="minilm-int8", api_key="s3cret", cors_origins=("https://app.example",)
    )
    return TestClient(create_app(engine, http=http))


def test_an_api_key_guards_every_route_but_the_health_probes(guarded):
    body = {"inputs": "a dog"}
    for path, call in [
        ("/embed", lambda h: guarded.post("/embed", json=body, headers=h)),
        (
            "/v1/embeddings",
            lambda h: guarded.post("/v1/embeddings", json={"input": "a"}, headers=h),
        ),
        ("/tokenize", lambda h: guarded.post("/tokenize", json=body, headers=h)),
        ("/info", lambda h: guarded.get("/info", headers=h)),
        ("/metrics", lambda h: guarded.get("/metrics", headers=h)),
    ]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = call(headers)
            assert r.status_code == 401, (path, headers)
            assert error_of(r)[1] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        assert call({"Authorization": "Bearer s3cret"}).status_code == 200, path
    assert guarded.get("/health").status_code == 200
    assert guarded.get("/ready").status_code == 200
    assert (
        'status="401"' in guarded.get("/metrics", headers={"Authorization": "Bearer s3cret"}).text
    )


def test_the_openai_sdk_sends_the_api_key_the_server_asks_for(guarded):
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="s3cret", http_client=guarded)
    got = sdk.embeddings.create(input=["a dog"], model="minilm-int8")
    assert len(got.data[0].embedding) > 0
    wrong = openai.OpenAI(base_url="http://testserver/v1", api_key="nope", http_client=guarded)
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(input=["a dog"], model="minilm-int8")


def test_cors_answers_allowed_origins_only(guarded):
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    ok = guarded.options("/embed", headers={"Origin": "https://app.example", **preflight})
    assert ok.status_code == 200  # a preflight carries no credentials: answered before the key
    assert ok.headers["access-control-allow-origin"] == "https://app.example"
    other = guarded.options("/embed", headers={"Origin": "https://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers
    r = guarded.post(
        "/embed",
        json={"inputs": "a"},
        headers={"Origin": "https://app.example", "Authorization": "Bearer s3cret"},
    )
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "https://app.example"


def test_the_served_model_name_is_what_info_and_the_model_list_report(guarded):
    auth = {"Authorization": "Bearer s3cret"}
    assert guarded.get("/info", headers=auth).json()["model"] == "minilm-int8"
    assert guarded.get("/v1/models", headers=auth).json()["data"][0]["id"] == "minilm-int8"


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"model_name": " "}, "served model name is empty"), ({"api_key": ""}, "API key is empty")],
)
def test_empty_http_settings_are_refused(fields, message):
    from squant.serve.app import HttpConfig

    with pytest.raises(squant.SquantError, match=message):
        HttpConfig(**fields)


def test_tokenize_answers_in_tei_shape(embedder):
    engine, client = embedder
    texts = ["the cat sat", "a dog"]
    rows = client.post("/tokenize", json={"inputs": texts}).json()
    assert len(rows) == 2
    for text, row in zip(texts, rows, strict=True):
        assert [t["id"] for t in row] == engine.tokenizer(text)["input_ids"]
        assert row[0]["special"] and row[-1]["special"] and row[0]["start"] is None
        for token in row[1:-1]:
            assert set(token) == {"id", "text", "special", "start", "stop"}
            assert not token["special"]
            assert token["text"] == text[token["start"] : token["stop"]]
    plain = client.post("/tokenize", json={"inputs": "a dog", "add_special_tokens": False}).json()
    assert [t["id"] for t in plain[0]] == [t["id"] for t in rows[1][1:-1]]
    assert not any(t["special"] for t in plain[0])


def test_serve_opens_its_port_before_warm_up_and_reports_progress(tiny_checkpoint, monkeypatch):
    """`squant serve`: the port answers while the engine warms up (503 with how far it got),
    then 200; a warm-up that fails stops the server with a one-line error."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    from squant.cli import main

    servers, release = [], threading.Event()
    real_init, real_start = uvicorn.Server.__init__, Engine.start

    def recording_init(self, *a, **k):
        real_init(self, *a, **k)
        servers.append(self)

    def slow_start(self, warm=True):
        self.warm_shapes = (3, 10)
        assert release.wait(60)
        real_start(self, warm)

    monkeypatch.setattr(uvicorn.Server, "__init__", recording_init)
    monkeypatch.setattr(Engine, "start", slow_start)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    codes: list[int] = []
    args = ["serve", str(tiny_checkpoint), "--port", str(port), "--runtime", "eager"]
    thread = threading.Thread(target=lambda: codes.append(main(args)), daemon=True)
    thread.start()
    url, seen = f"http://127.0.0.1:{port}/ready", []
    deadline = time.time() + 60
    while time.time() < deadline and not seen:
        try:
            seen.append(httpx.get(url, timeout=2))
        except httpx.TransportError:
            time.sleep(0.1)
    assert seen and seen[0].status_code == 503
    assert seen[0].json() == {"status": "starting", "warmed_shapes": 3, "shapes": 10}
    release.set()
    while time.time() < deadline and httpx.get(url, timeout=2).status_code != 200:
        time.sleep(0.1)
    assert httpx.get(url, timeout=2).json() == {"status": "ready"}
    servers[-1].should_exit = True
    thread.join(30)
    assert codes == [0]

    def failing_start(self, warm=True):
        raise RuntimeError("compiler crashed\nsecond line")

    monkeypatch.setattr(Engine, "start", failing_start)
    assert main(args) == 2


@pytest.fixture(scope="module")
def cross_encoder(tokenizer):
    """A cross-encoder: a sequence classifier with one output (what /rerank serves)."""
    model = tiny_model("bert", "sequence-classification", vocab_size=len(tokenizer), num_labels=1)
    q = squant.quantize(model, calibration=_calib(model), progress=False)
    engine = Engine(q, tokenizer, ServeConfig(instances=1, cores_per_instance=1))
    engine.start(warm=False)
    yield engine, TestClient(create_app(engine, "tiny-rerank"))
    engine.stop(1.0)


def test_rerank_scores_each_pair_best_first_as_tei_does(cross_encoder):
    engine, client = cross_encoder
    query, texts = "the cat sat", ["a dog runs", "the cat sat on the mat", "red car", ""]
    r = client.post("/rerank", json={"query": query, "texts": texts, "return_text": True})
    assert r.status_code == 200, r.text
    ranked = r.json()
    assert sorted(x["index"] for x in ranked) == [0, 1, 2, 3]
    scores = [x["score"] for x in ranked]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert all(x["text"] == texts[x["index"]] for x in ranked)
    # each score is the model's own on that pair alone, through the sigmoid
    for x in ranked:
        enc = engine.tokenizer([query], [texts[x["index"]]], return_tensors="pt")
        with torch.no_grad():
            logit = float(engine.model(**enc).logits[0, 0])
        assert abs(x["score"] - 1 / (1 + math.exp(-logit))) < 2e-3
    raw = client.post("/rerank", json={"query": query, "texts": texts, "raw_scores": True}).json()
    assert "text" not in raw[0]  # only with return_text
    for x, s in zip(raw, ranked, strict=True):  # the logits, in the same order
        assert x["index"] == s["index"] and abs(1 / (1 + math.exp(-x["score"])) - s["score"]) < 1e-6
    assert client.post("/rerank", json={"query": query, "texts": []}).status_code == 400


def test_rerank_on_a_model_that_is_not_a_cross_encoder_names_the_right_route(classifier, embedder):
    for _, client in (classifier, embedder):
        r = client.post("/rerank", json={"query": "a", "texts": ["b"]})
        assert r.status_code == 422 and r.json()["error_type"] == "wrong_route", r.text


def test_embed_all_returns_every_tokens_hidden_state_as_tei_does(embedder, classifier):
    engine, client = embedder
    texts = ["the cat sat on the mat", "a dog", ""]
    # pooled and per-token requests at once: batches never mix the two
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        alls = [pool.submit(client.post, "/embed_all", json={"inputs": texts}) for _ in range(3)]
        pooled = [pool.submit(client.post, "/embed", json={"inputs": texts}) for _ in range(3)]
        alls, pooled = [f.result() for f in alls], [f.result() for f in pooled]
    assert all(r.status_code == 200 for r in alls + pooled), alls[0].text
    got = alls[0].json()
    assert all(r.json() == got for r in alls)
    for text, rows in zip(texts, got, strict=True):
        enc = engine.tokenizer([text], return_tensors="pt")
        with torch.no_grad():
            ref = engine.model(**enc).last_hidden_state[0]
        assert len(rows) == enc["input_ids"].shape[1]  # one row per token, [CLS] and [SEP] too
        out = torch.tensor(rows)
        assert float(torch.nn.functional.cosine_similarity(out, ref, dim=-1).min()) > 0.999
    assert torch.tensor(pooled[0].json()).shape == (len(texts), got[0][0].__len__())
    one = client.post("/embed_all", json={"inputs": "a dog"}).json()
    assert torch.allclose(torch.tensor(one[0]), torch.tensor(got[1]), atol=1e-5)
    assert client.post("/embed_all", json={"inputs": []}).status_code == 400
    r = classifier[1].post("/embed_all", json={"inputs": "a dog"})
    assert r.status_code == 422 and r.json()["error_type"] == "wrong_route"


def test_idle_workers_share_a_big_request_and_busy_ones_batch_it_whole(tokenizer):
    """8 texts of one length bucket: with both workers idle, each runs half (the request then
    takes about half as long); with one worker, one batch of 8."""
    model = tiny_model("bert", vocab_size=len(tokenizer))
    texts = ["the cat sat on the mat and the dog runs fast"] * 8
    for instances, expected in ((2, [4, 4]), (1, [8])):
        sizes: list[int] = []

        def runner(sizes=sizes, **inputs):
            sizes.append(int(inputs["input_ids"].shape[0]))
            time.sleep(0.05)  # long enough that both workers are taken
            return model(**inputs)

        config = ServeConfig(instances=instances, cores_per_instance=1)
        engine = Engine(model, tokenizer, config, runner=runner)
        engine.start(warm=False)
        try:
            deadline = time.monotonic() + 5
            while engine.queue._waiting < instances and time.monotonic() < deadline:
                time.sleep(0.01)  # every worker is waiting for work
            futures = engine.submit(engine.tokenize(texts))
            rows = [f.result(timeout=30) for f in futures]
        finally:
            engine.stop(1.0)
        assert sorted(sizes) == expected, instances
        assert len(rows) == 8 and all(torch.equal(r, rows[0]) for r in rows)

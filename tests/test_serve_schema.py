"""The server against its own OpenAPI description, fuzzed (schemathesis + hypothesis).

schemathesis generates requests for every route and method the app's /openapi.json declares,
valid and invalid alike (wrong types, missing fields, arbitrary Unicode); a second test sends
arbitrary Unicode, lone surrogates included, as the texts of every inference route. No
answer may be a 5xx: bad input is the client's error (4xx), never the server's.
"""

from __future__ import annotations

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("fastapi")

import squant  # noqa: E402
from squant.engine.engine import Engine, ServeConfig  # noqa: E402
from squant.serve.app import create_app  # noqa: E402
from tests.helpers import tiny_model, token_batches  # noqa: E402

st = hypothesis.strategies


@pytest.fixture(scope="module")
def quantized(tiny_checkpoint):
    from squant.checkpoint.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_checkpoint)
    model = tiny_model("bert", vocab_size=len(tokenizer))
    v = model.config.vocab_size
    calibration = [
        {"input_ids": b["input_ids"] % v, "attention_mask": b["attention_mask"]}
        for b in token_batches()
    ]
    return squant.quantize(model, calibration=calibration, progress=False), tokenizer


@pytest.fixture
def served(quantized):
    """An app over its own engine (a client that runs the app's lifespan drains it at exit)."""
    q, tokenizer = quantized
    config = ServeConfig(instances=1, cores_per_instance=1, max_inputs=8, runtime="eager")
    engine = Engine(q, tokenizer, config)
    engine.start()
    yield create_app(engine, "tiny")
    engine.stop(1.0)


def test_no_route_answers_5xx_to_any_request_its_schema_allows_or_refuses(served):
    schema = schemathesis.openapi.from_asgi("/openapi.json", served)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/embed", "/v1/embeddings", "/tokenize", "/"}
    for op in operations:

        @hypothesis.settings(max_examples=40, deadline=None, database=None)
        @hypothesis.given(case=op.as_strategy())
        def one(case) -> None:
            response = case.call()
            assert response.status_code < 500, (case.method, case.path, case.body, response.text)

        one()


# every Unicode code point, surrogates included (a JSON "\ud800" escape decodes to one)
TEXT = st.text(st.characters(codec=None, categories=None), max_size=40)


@hypothesis.settings(
    max_examples=150,
    deadline=None,
    database=None,
    # one engine for every example is the point: no request may break it for the next
    suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)
@hypothesis.given(
    route=st.sampled_from(["/embed", "/", "/v1/embeddings", "/tokenize", "/predict"]),
    texts=st.lists(TEXT, min_size=1, max_size=4),
    single=st.booleans(),
)
def test_no_text_yields_a_5xx(served, route, texts, single):
    from fastapi.testclient import TestClient

    value: object = texts[0] if single else texts
    body = {"input": value} if route == "/v1/embeddings" else {"inputs": value}
    # ensure_ascii: lone surrogates travel as \\ud800 escapes, as a client's JSON encoder sends them
    data = json.dumps(body, ensure_ascii=True).encode()
    client = TestClient(served)  # no lifespan: its exit would drain the engine
    r = client.post(route, content=data, headers={"content-type": "application/json"})
    assert r.status_code < 500, (route, body, r.text)

"""The variant registry and the bounded shapes compiled/packaged variants run at."""

import pytest
import torch

import squant
from squant.bench.variants import VARIANT_NAMES, BuildContext, Variant, build, parse, parse_variants
from squant.errors import SquantError
from squant.quant.mappings import input_names, model_inputs
from squant.runtime.outputs import NamedOutputs
from squant.runtime.shapes import PaddedShapes, buckets_up_to
from tests.helpers import cosine, tiny_model, token_batches


def test_names_parse_to_precision_and_runtime():
    assert parse("static") == Variant("static", "eager")
    assert parse("static-compiled").runtime == "compiled"
    assert parse(" dynamic-pt2 ").name == "dynamic-pt2"
    assert parse("bf16-compiled").gemm_dtype == "bf16"
    assert parse("dynamic").gemm_dtype == "int8"
    assert len(VARIANT_NAMES) == 12
    assert [v.name for v in parse_variants("fp32, static,static-pt2")] == [
        "fp32",
        "static",
        "static-pt2",
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("int4", "unknown variant 'int4'"),
        ("static-eager", "unknown variant"),  # eager is spelled without a suffix
        ("static-onnx", "unknown variant"),
        ("", "no variant given"),
        ("fp32,fp32", "listed twice"),
    ],
)
def test_bad_variant_names_are_refused(spec, message):
    with pytest.raises(SquantError, match=message):
        parse_variants(spec)


def test_compiled_variants_need_an_example_and_static_needs_calibration():
    model = tiny_model("bert")
    with pytest.raises(SquantError, match="pass example_inputs"):
        build("fp32-compiled", model, BuildContext())
    with pytest.raises(SquantError, match="needs calibration"):
        build("static", model, BuildContext())


class _Recorder(torch.nn.Module):
    """Stands in for a compiled model: records the shapes it is called with."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = model.config
        self.shapes = set()

    def forward(self, **inputs):
        self.shapes.add(tuple(inputs["input_ids"].shape))
        return self.model(**inputs)


@pytest.mark.parametrize("head", ["base", "question-answering", "sequence-classification"])
def test_padded_shapes_return_what_the_model_returns_unpadded(head):
    model = tiny_model("bert", head)
    recorder = _Recorder(model)
    shaped = PaddedShapes(recorder, batch=4, buckets=(8, 16, 32))
    g = torch.Generator().manual_seed(0)
    for rows, seq in [(1, 3), (4, 8), (7, 11), (9, 30), (2, 16)]:  # ragged, > batch, on edge
        ids = torch.randint(3, 100, (rows, seq), generator=g)
        mask = torch.ones_like(ids)
        mask[0, seq // 2 + 1 :] = 0
        inputs = {"input_ids": ids, "attention_mask": mask}
        with torch.no_grad():
            expected = model(**inputs)
        got = shaped(**inputs)
        assert list(got) == [k for k, v in expected.items() if torch.is_tensor(v)]
        for name, value in got.items():
            ref = expected[name]
            assert value.shape == ref.shape, name
            keep = mask.bool() if value.dim() >= 2 and value.shape[1] == seq else None
            if keep is not None:  # padding positions of the input itself hold arbitrary values
                value, ref = value[keep], ref[keep]
            torch.testing.assert_close(value, ref, rtol=1e-4, atol=1e-5)
    # only [batch, bucket] shapes ever reached the model
    assert recorder.shapes <= {(4, 8), (4, 16), (4, 32)}
    assert len(recorder.shapes) == 3


def test_padded_shapes_refuse_inputs_beyond_the_longest_bucket():
    shaped = PaddedShapes(tiny_model("bert"), batch=2, buckets=(8,))
    ids = torch.ones(1, 9, dtype=torch.long)
    with pytest.raises(SquantError, match="exceeds the longest compiled shape"):
        shaped(input_ids=ids, attention_mask=ids)


def test_buckets_end_at_the_longest_input():
    assert buckets_up_to(128) == (16, 32, 64, 128)
    assert buckets_up_to(384) == (16, 32, 64, 128, 256, 384)
    assert buckets_up_to(10) == (10,)


def test_wrappers_take_the_inputs_of_their_architecture():
    bert, distil = tiny_model("bert"), tiny_model("distilbert")
    enc = {"input_ids": 1, "attention_mask": 2, "token_type_ids": 3}
    assert list(model_inputs(PaddedShapes(bert, 1, None), enc)) == list(enc)
    assert input_names(PaddedShapes(distil, 1, None)) == ("input_ids", "attention_mask")
    with pytest.raises(SquantError, match="unsupported model"):
        input_names(torch.nn.Linear(2, 2))


def test_named_outputs_read_like_a_model_output():
    out = NamedOutputs(logits=torch.ones(1))
    assert out.logits is out["logits"]
    with pytest.raises(AttributeError, match="no output 'start_logits'"):
        _ = out.start_logits


@pytest.mark.compile
def test_static_compiled_variant_matches_eager_static_on_any_length():
    model = tiny_model("bert", "question-answering", outliers=True)
    calibration = token_batches()
    example = token_batches(n=1, seed=5)[0]
    ctx = BuildContext(
        calibration, example_inputs=example, buckets=(16, 32), float_dtype="fp32", progress=False
    )
    eager = build("static", model, ctx)
    compiled = build("static-compiled", model, ctx)
    assert compiled.squant_info.config.mode == "static"
    for batch in token_batches(n=3, batch=6, seq=5, seed=9):  # 6 rows > batch 4; seq 5..11
        with torch.no_grad():
            ref = eager(**batch)
        got = compiled(**model_inputs(compiled, batch))
        assert got.start_logits.shape == ref.start_logits.shape
        keep = batch["attention_mask"].bool()
        assert cosine(ref.start_logits[keep], got.start_logits[keep]) > 0.999


def test_squant_exports_the_registry():
    assert squant.variants.parse("fp32").name == "fp32"

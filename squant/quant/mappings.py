"""Architecture knowledge as data: where each encoder keeps the linears squant quantizes.

Every supported encoder is post-LayerNorm with the same four GEMM sites per layer:

    x ─ LN ─┬─ Q,K,V ─ attention ─ attn_out ─(+x)─ LN ─┬─ ffn_in ─ GELU ─ ffn_out ─(+)─ LN
            └──────────── residual ──────────────┘     └────────── residual ──────────┘

Paths below are relative to one encoder layer (``layers`` is relative to the base model).
An architecture missing here is refused with an error that lists these, never mapped by guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import SquantError


@dataclass(frozen=True)
class EncoderLayout:
    layers: str  # the ModuleList of encoder layers, from the base model
    attention: str  # the self-attention module that owns the Q/K/V linears
    query: str  # linear names inside the attention module
    key: str
    value: str
    attn_out: str  # the attention output projection
    ffn_in: str  # hidden -> intermediate (followed by the activation)
    ffn_out: str  # intermediate -> hidden
    ffn_act: str  # the activation module between ffn_in and ffn_out
    num_heads: str  # config attribute holding the head count
    position_offset: int = 0  # positions reserved before the first token (RoBERTa: pad + 1)
    token_types: bool = True  # takes token_type_ids (DistilBERT has no segment embeddings)


BERT_LAYOUT = EncoderLayout(
    layers="encoder.layer",
    attention="attention.self",
    query="query",
    key="key",
    value="value",
    attn_out="attention.output.dense",
    ffn_in="intermediate.dense",
    ffn_out="output.dense",
    ffn_act="intermediate.intermediate_act_fn",
    num_heads="num_attention_heads",
)

# RoBERTa-style models offset positions by padding_idx + 1 (= 2 with pad id 1).
ROBERTA_LAYOUT = EncoderLayout(**{**BERT_LAYOUT.__dict__, "position_offset": 2})

DISTILBERT_LAYOUT = EncoderLayout(
    layers="transformer.layer",
    attention="attention",
    query="q_lin",
    key="k_lin",
    value="v_lin",
    attn_out="attention.out_lin",
    ffn_in="ffn.lin1",
    ffn_out="ffn.lin2",
    ffn_act="ffn.activation",
    num_heads="n_heads",
    token_types=False,
)

# config.model_type -> layout. MiniLM checkpoints are BertModel (model_type "bert").
LAYOUTS: dict[str, EncoderLayout] = {
    "bert": BERT_LAYOUT,
    "distilbert": DISTILBERT_LAYOUT,
    "roberta": ROBERTA_LAYOUT,
    "xlm-roberta": ROBERTA_LAYOUT,
}

# Model classes squant has been tested with (base model and common task heads). Used to
# rebuild a saved model without executing anything from the file.
SUPPORTED_CLASSES: dict[str, tuple[str, ...]] = {
    "bert": (
        "BertModel",
        "BertForSequenceClassification",
        "BertForQuestionAnswering",
        "BertForTokenClassification",
        "BertForMaskedLM",
    ),
    "distilbert": (
        "DistilBertModel",
        "DistilBertForSequenceClassification",
        "DistilBertForQuestionAnswering",
        "DistilBertForTokenClassification",
        "DistilBertForMaskedLM",
    ),
    "roberta": (
        "RobertaModel",
        "RobertaForSequenceClassification",
        "RobertaForQuestionAnswering",
        "RobertaForTokenClassification",
        "RobertaForMaskedLM",
    ),
    "xlm-roberta": (
        "XLMRobertaModel",
        "XLMRobertaForSequenceClassification",
        "XLMRobertaForQuestionAnswering",
        "XLMRobertaForTokenClassification",
        "XLMRobertaForMaskedLM",
    ),
}


def supported_summary() -> str:
    return "; ".join(f"{t}: {', '.join(c)}" for t, c in SUPPORTED_CLASSES.items())


def layout_for(model: nn.Module) -> EncoderLayout:
    """The layout of a Hugging Face encoder, or a SquantError naming what is supported."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    cls = type(model).__name__
    if model_type not in LAYOUTS:
        raise SquantError(
            f"unsupported model {cls} (model_type={model_type!r}); squant supports "
            f"{supported_summary()}"
        )
    if cls not in SUPPORTED_CLASSES[model_type]:
        raise SquantError(
            f"unsupported model class {cls} for model_type {model_type!r}; supported: "
            f"{', '.join(SUPPORTED_CLASSES[model_type])}"
        )
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise SquantError(
            f"{cls} is configured as a decoder (is_decoder/add_cross_attention); squant "
            "quantizes bidirectional encoders only"
        )
    return LAYOUTS[model_type]


MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def input_names(model: Any) -> tuple[str, ...]:
    """The inputs a model takes by keyword: stated by packaged models (`input_names`), else
    the architecture's (compiled and shape-padded wrappers expose the model's config)."""
    stated = getattr(model, "input_names", None)
    if stated is not None:
        return tuple(stated)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    layout = LAYOUTS[model_type] if model_type in LAYOUTS else layout_for(model)  # raises
    return MODEL_INPUT_KEYS if layout.token_types else MODEL_INPUT_KEYS[:2]


def model_inputs(model: Any, encoding: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a tokenizer output this model's forward takes (by keyword)."""
    return {k: encoding[k] for k in input_names(model) if k in encoding}


def hf_config(model: Any) -> Any:
    """A Hugging Face model's config (transformers is not type-checked here: it is Any)."""
    return model.config


def linear_at(model: nn.Module, name: str) -> nn.Linear:
    """The nn.Linear (or subclass) at `name`; anything else is an architecture squant's layout
    misdescribes, said plainly."""
    module = model.get_submodule(name)
    if not isinstance(module, nn.Linear):
        raise SquantError(f"{name} is a {type(module).__name__}, not the Linear squant expects")
    return module


def max_positions(model: nn.Module) -> int:
    """The longest token sequence the model accepts: its position embeddings', or what a
    packaged/shape-padded model states (`max_seq`)."""
    stated = getattr(model, "max_seq", None)
    if stated is not None:
        return int(stated)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    layout = LAYOUTS[model_type] if model_type in LAYOUTS else layout_for(model)  # raises
    return int(hf_config(model).max_position_embeddings) - layout.position_offset


# Activation modules the int8 GEMM can apply in its epilogue (static mode), by class name.
FUSABLE_ACTIVATIONS: dict[str, str] = {
    "GELUActivation": "gelu",  # erf GELU (also its pure-python variant)
    "NewGELUActivation": "gelu_tanh",
    "GELUTanh": "gelu_tanh",
    "ReLU": "relu",
}


def fusable_activation(module: nn.Module) -> str | None:
    """The name of the activation an int8 GEMM can fuse for this module, or None."""
    if type(module).__name__ == "GELU":  # torch.nn.GELU
        return "gelu_tanh" if module.approximate == "tanh" else "gelu"
    return FUSABLE_ACTIVATIONS.get(type(module).__name__)

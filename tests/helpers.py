"""Tiny random encoders for every supported architecture, and error metrics."""

from __future__ import annotations

import re
from typing import Any

import torch
import transformers
from torch import Tensor, nn

from squant.runtime.outputs import first_tensor as main_output

ARCHS = ("bert", "distilbert", "roberta", "xlm-roberta")
HEADS = ("base", "sequence-classification", "question-answering", "token-classification")
VOCAB = 120

_CLASS_PREFIX = {
    "bert": "Bert",
    "distilbert": "DistilBert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
}
_HEAD_SUFFIX = {
    "base": "Model",
    "sequence-classification": "ForSequenceClassification",
    "question-answering": "ForQuestionAnswering",
    "token-classification": "ForTokenClassification",
    "masked-lm": "ForMaskedLM",
}


def tiny_config(arch: str, init: float = 0.1, **overrides: object) -> transformers.PretrainedConfig:
    """hidden 64, 2 layers, 4 heads, FFN 128."""
    if arch == "distilbert":
        kw = {"dim": 64, "n_layers": 2, "n_heads": 4, "hidden_dim": 128}
    else:
        kw = {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 128,
        }
    pad = 1 if "roberta" in arch else 0
    kw.update(
        vocab_size=VOCAB,
        max_position_embeddings=64 + (2 if "roberta" in arch else 0),
        initializer_range=init,
        pad_token_id=pad,
        num_labels=3,
    )
    kw.update(overrides)
    return transformers.AutoConfig.for_model(arch, **kw)


def tiny_model(
    arch: str, head: str = "base", seed: int = 0, outliers: bool = False, **overrides: object
) -> nn.Module:
    torch.manual_seed(seed)
    cls = getattr(transformers, _CLASS_PREFIX[arch] + _HEAD_SUFFIX[head])
    if head == "question-answering":
        overrides.setdefault("num_labels", 2)  # start and end logits
    model = cls(tiny_config(arch, **overrides)).eval()
    if outliers:
        inject_outliers(model)
    return model


@torch.no_grad()
def inject_outliers(model: nn.Module, channels: tuple[int, ...] = (3, 41), gain: float = 25.0):
    """Give activations a few large channels, as trained BERTs have: LayerNorm gains on the
    hidden side (feed Q/K/V, FFN-in and the residual) and a few hot FFN units (feed FFN-out)."""
    for name, m in model.named_modules():
        if isinstance(m, nn.LayerNorm):
            m.weight[list(channels)] *= gain
        if name.endswith(("intermediate.dense", "ffn.lin1")):
            m.weight[[5, 77]] *= gain / 3
            m.bias[[5, 77]] += 3.0


def token_batches(
    n: int = 2, batch: int = 4, seq: int = 12, seed: int = 1, pad: int = 0, vary: bool = True
) -> list[dict[str, Tensor]]:
    """Random token batches; the first row of each is padded, and lengths vary by batch."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = seq + (3 * i if vary else 0)
        ids = torch.randint(3, VOCAB, (batch, length), generator=g)
        mask = torch.ones_like(ids)
        mask[0, length // 2 :] = 0
        ids[0, length // 2 :] = pad
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def sqnr_db(ref: Tensor, test: Tensor) -> float:
    """10·log10(|ref|² / |ref - test|²)."""
    noise = (ref - test).float().pow(2).sum().clamp(min=1e-30)
    return float(10 * torch.log10(ref.float().pow(2).sum() / noise))


def cosine(ref: Tensor, test: Tensor) -> float:
    return float(nn.functional.cosine_similarity(ref.flatten().float(), test.flatten().float(), 0))


def run(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The model's main output (hidden states, logits or start logits)."""
    with torch.no_grad():
        return main_output(model(**batch))


def last_hidden(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The encoder's last hidden states, whatever head sits on top (what int8 changes)."""
    with torch.no_grad():
        return model(**batch, output_hidden_states=True).hidden_states[-1]


def error_of(response: Any) -> tuple[str, str]:
    """(message, kind) of a server error in either shape: TEI's {"error", "error_type"}, or
    OpenAI's {"error": {"message", "code"}} under /v1/."""
    body = response.json()
    if isinstance(body["error"], dict):
        return body["error"]["message"], body["error"]["code"]
    return body["error"], body["error_type"]


# An int8 GEMM call in inductor's Python wrapper, on either kernel QuantLinear runs (squant's
# own where it runs, else oneDNN's; squant.int8.gemm_kernel).
# (squant's GEMM whose output is only per-token quantized for the next one runs as
# int8_linear_quantize_rows, the Q|K|V GEMM with the INT8 attention as int8_linear_attention:
# squant.runtime.fusion)
SQUANT_GEMM = r"squant\.int8_linear(?:_quantize_rows|_attention)?"
INT8_GEMM_CALL = rf"torch\.ops\.(?:onednn\.qlinear_pointwise|{SQUANT_GEMM})\.\w+\("
# ... and one whose epilogue applies exact GELU
GELU_GEMM_CALL = rf"(?:'gelu', \[None\], 'none'\)|{SQUANT_GEMM}\.\w+\([^\n]*'gelu',)"
# ... and one without a bias tensor (squant's bias is its 7th argument)
UNBIASED_GEMM_CALL = (
    r"squant\.int8_linear(?:_quantize_rows|_attention)?\.\w+\((?:[^,()]+,\s*){6}None"
)


def int8_gemm_calls(code: str) -> list[str]:
    return re.findall(INT8_GEMM_CALL, code)


def gelu_gemm_calls(code: str) -> list[str]:
    return re.findall(GELU_GEMM_CALL, code)

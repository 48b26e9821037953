"""squant.quantize: any model squant supports in, its INT8 twin out. A Hugging Face encoder
goes to the algorithm (quantize.py); a SentenceTransformer has its encoder quantized and the
rest (pooling, normalisation, tokenizer) kept (sentence_transformer.py). The dispatch lives
here, above both, so the algorithm core never imports the sentence-transformers layer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from ..quant.config import SmoothQuantConfig
from ..quant.quantize import quantize_encoder
from . import sentence_transformer


def quantize(
    model: nn.Module,
    config: SmoothQuantConfig | None = None,
    calibration: Iterable[Any] | None = None,
    *,
    inplace: bool = False,
    progress: bool = True,
) -> nn.Module:
    """SmoothQuant INT8 of a Hugging Face encoder or a SentenceTransformer; returns a model
    called like the input, with the same outputs. The input is left untouched unless
    inplace=True.

    calibration: an iterable of tokenizer outputs (dicts with input_ids, attention_mask, ...)
    or input_ids tensors; for a SentenceTransformer also plain texts. A few dozen sentences
    of the target domain are enough.
    """
    config = config or SmoothQuantConfig()
    if sentence_transformer.is_sentence_transformer(model):
        return sentence_transformer.quantize(model, config, calibration, inplace, progress)
    return quantize_encoder(model, config, calibration, inplace=inplace, progress=progress)

"""Built-in model configs: the published configs of common encoders, with RANDOM weights.

Useful for speed and fidelity work where real weights are not at hand; every result made
from them says "random weights". The configs are copied from the models' config.json.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import Tensor, nn

from ..errors import SquantError
from ..quant.mappings import hf_config

XLMR_BASE: dict[str, Any] = {
    "model_type": "xlm-roberta",
    "vocab_size": 250002,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}

BUILTIN_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "bert-base-uncased": (
        "BertModel",
        {
            "model_type": "bert",
            "vocab_size": 30522,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
        },
    ),
    "bert-large-uncased": (
        "BertModel",
        {
            "model_type": "bert",
            "vocab_size": 30522,
            "hidden_size": 1024,
            "num_hidden_layers": 24,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
        },
    ),
    "distilbert-base-uncased": (
        "DistilBertModel",
        {
            "model_type": "distilbert",
            "vocab_size": 30522,
            "dim": 768,
            "n_layers": 6,
            "n_heads": 12,
            "hidden_dim": 3072,
            "max_position_embeddings": 512,
            "sinusoidal_pos_embds": False,
            "activation": "gelu",
        },
    ),
    "xlm-roberta-base": ("XLMRobertaModel", XLMR_BASE),
    # RoBERTa-base: XLM-R-base's architecture with a 50k vocabulary
    "roberta-base": (
        "RobertaModel",
        {**XLMR_BASE, "model_type": "roberta", "vocab_size": 50265},
    ),
}


def is_builtin(name: str) -> bool:
    return name in BUILTIN_CONFIGS


def random_model(name: str, seed: int = 0) -> nn.Module:
    """The named architecture with seeded random weights (float32, eval mode)."""
    if name not in BUILTIN_CONFIGS:
        raise SquantError(
            f"unknown built-in config {name!r}; choose from {', '.join(BUILTIN_CONFIGS)}"
        )
    cls_name, kw = BUILTIN_CONFIGS[name]
    kw = dict(kw)
    config = transformers.AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(seed)
    return getattr(transformers, cls_name)(config).eval()


def random_inputs(model: nn.Module, batch: int, seq: int, seed: int = 1) -> dict[str, Tensor]:
    """Token ids drawn from the vocabulary (special ids avoided), full attention mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, int(hf_config(model).vocab_size), (batch, seq), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def random_calibration(
    model: nn.Module, batches: int = 8, batch: int = 4, seq: int = 128
) -> list[dict[str, Tensor]]:
    """Calibration batches for a random-weight model (random tokens, like its weights)."""
    return [random_inputs(model, batch, seq, seed=100 + i) for i in range(batches)]

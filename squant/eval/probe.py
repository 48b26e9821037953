"""Linear probes for encoders without a task head (e.g. sentence-embedding models).

A multinomial logistic-regression head is trained once on FP32 features and reused unchanged
for every variant (FP32, BF16, INT8 ...): a change in accuracy is the encoder's doing.
Pair tasks use the classic features [u, v, |u - v|, u * v] of mean-pooled sentence vectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ..quant.mappings import model_inputs
from ..runtime.outputs import mean_pool


@torch.no_grad()
def embed(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int = 128,
    max_length: int = 128,
    normalize: bool = True,
    desc: str = "embedding",
    progress: bool = True,
) -> Tensor:
    """Mean-pooled (optionally L2-normalized) last hidden states, [len(texts), hidden] float32.

    Texts are batched by length (less padding), results come back in input order.
    """
    lengths = [len(t) for t in texts]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    out: Tensor | None = None
    bar = tqdm(total=len(texts), desc=desc, disable=not progress, leave=False)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        enc = tokenizer(
            [texts[i] for i in idx],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        hidden = last_hidden_state(model, model_inputs(model, enc))
        pooled = mean_pool(hidden, enc["attention_mask"])
        if normalize:
            pooled = nn.functional.normalize(pooled, dim=-1)
        if out is None:
            out = torch.empty(len(texts), pooled.shape[-1])
        out[idx] = pooled
        bar.update(len(idx))
    bar.close()
    if out is None:
        raise ValueError("no texts to embed")
    return out


def last_hidden_state(model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
    """The encoder's last hidden states, for a base model or one with a task head (compiled
    and packaged variants of a base model have no `base_model`: their first output is it)."""
    if getattr(model, "base_model", model) is model:
        return model(**inputs).last_hidden_state
    return model(**inputs, output_hidden_states=True).hidden_states[-1]


def pair_features(u: Tensor, v: Tensor) -> Tensor:
    """[u, v, |u - v|, u * v] -> [N, 4 * hidden]."""
    return torch.cat([u, v, (u - v).abs(), u * v], dim=-1)


@dataclass
class LinearProbe:
    """Softmax regression on standardized features (weights fit by L-BFGS)."""

    weight: Tensor  # [classes, features]
    bias: Tensor  # [classes]
    mean: Tensor  # [features]
    std: Tensor  # [features]

    @classmethod
    def fit(
        cls, x: Tensor, y: Tensor, num_classes: int, l2: float = 1e-4, max_iter: int = 300
    ) -> LinearProbe:
        x = x.double()
        mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
        z = (x - mean) / std
        w = torch.zeros(num_classes, x.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS(
            [w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe"
        )

        def closure() -> Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(z @ w.T + b, y) + l2 * w.pow(2).sum()
            loss.backward()  # type: ignore[no-untyped-call]
            return loss

        with torch.enable_grad():
            opt.step(closure)  # type: ignore[no-untyped-call]
        return cls(w.detach(), b.detach(), mean, std)

    def logits(self, x: Tensor) -> Tensor:
        return ((x.double() - self.mean) / self.std) @ self.weight.T + self.bias

    def predict(self, x: Tensor) -> Tensor:
        return self.logits(x).argmax(-1)


def accuracy(pred: Tensor, gold: Tensor) -> float:
    """Percent of predictions equal to the gold labels."""
    if pred.shape != gold.shape or pred.numel() == 0:
        raise ValueError(f"need equal, non-empty shapes, got {pred.shape} and {gold.shape}")
    return 100.0 * float((pred == gold).float().mean())


def paired_accuracy_delta(pred: Tensor, ref_pred: Tensor, gold: Tensor) -> dict[str, float]:
    """Accuracy of pred minus that of ref_pred on the same examples, in points, with the
    half-width of its 95% confidence interval (normal approximation of the paired
    difference). Two INT8 variants a few tenths apart differ in which near-boundary pairs
    flip, not in quality, unless the interval excludes 0."""
    if not pred.shape == ref_pred.shape == gold.shape or pred.numel() < 2:
        raise ValueError(f"need equal shapes of >= 2 examples, got {pred.shape}, {ref_pred.shape}")
    d = (pred == gold).double() - (ref_pred == gold).double()
    half = 1.96 * float(d.std()) / d.numel() ** 0.5
    return {"accuracy_delta": 100.0 * float(d.mean()), "accuracy_delta_ci95": 100.0 * half}


def row_cosines(a: Tensor, b: Tensor) -> Tensor:
    """cos(a_i, b_i) for each row i (embeddings of one input each)."""
    return nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def mean_cosine(a: Tensor, b: Tensor) -> float:
    """Mean over rows of cos(a_i, b_i)."""
    return float(row_cosines(a, b).mean())


def cosine_tail(a: Tensor, b: Tensor) -> dict[str, float]:
    """The worst rows of cos(a_i, b_i): minimum and 1st percentile. A mean hides the inputs
    a quantized model gets wrong (static INT8 on empty or 512-token inputs)."""
    cos = row_cosines(a, b)
    return {"cosine_min": float(cos.min()), "cosine_p1": float(torch.quantile(cos, 0.01))}

"""What a model call returns, read the same way everywhere: a tensor, a tuple, or a
transformers ModelOutput (a mapping whose first field is the main output)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor


def output_tensors(out: Any) -> tuple[Tensor, ...]:
    """Every tensor of a model output, in field order (None fields skipped)."""
    if isinstance(out, Tensor):
        return (out,)
    values = out.values() if isinstance(out, Mapping) else out
    return tuple(v for v in values if isinstance(v, Tensor))


def first_tensor(out: Any) -> Tensor:
    """The main output of a model call: last hidden state, logits, or start logits."""
    tensors = output_tensors(out)
    if not tensors:
        raise TypeError(f"the model returned no tensor ({type(out).__name__})")
    return tensors[0]


def named_tensors(out: Any) -> dict[str, Tensor]:
    """The tensors of a model output by field name (`output_i` for unnamed tuple entries)."""
    if isinstance(out, Mapping):
        return {k: v for k, v in out.items() if isinstance(v, Tensor)}
    return {f"output_{i}": t for i, t in enumerate(output_tensors(out))}


class NamedOutputs(dict[str, Tensor]):
    """Named output tensors read like a transformers ModelOutput: `out.logits`,
    `out["logits"]`, `out[0]` (by position, as ModelOutput allows), or in order. What packaged
    and shape-padded models return."""

    def __getitem__(self, key: str | int) -> Tensor:
        if isinstance(key, int):
            values = list(self.values())
            if not -len(values) <= key < len(values):
                raise IndexError(f"output {key} out of range (the model has {len(values)})")
            return values[key]
        return super().__getitem__(key)

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no output {name!r} (the model has {list(self)})") from None


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """[batch, seq, dim] -> [batch, dim]: the mean over each row's real tokens (padding
    excluded; an all-padding row gives zeros), in float32."""
    mask = attention_mask.unsqueeze(-1).float()
    return (hidden.float() * mask).sum(1) / mask.sum(1).clamp(min=1.0)

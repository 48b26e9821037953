"""A bounded set of input shapes for compiled and packaged models.

Compiled code specializes on shapes (torch.compile recompiles per new shape and gives up after
8; an AOTInductor package accepts only the batch it was exported for), while eval batches and
served requests come in any size and length. `PaddedShapes` pads every call up to a fixed
batch and to the next of a few sequence-length buckets, runs the model, and cuts the outputs
back, so the model sees at most len(buckets) shapes. Batches larger than the fixed batch run in
chunks. Padding changes nothing a user reads: padded positions are masked out of attention,
and the GEMMs, LayerNorm and per-token (dynamic) quantization treat every row on its own;
padded rows repeat real rows, so no all-masked row ever runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import SquantError
from ..quant.mappings import max_positions
from ..quant.record import QuantizationRecord, record_of
from .outputs import NamedOutputs, named_tensors

# sequence-length buckets squant compiles and serves (powers of two up to BERT's 512)
BUCKETS = (16, 32, 64, 128, 256, 512)
# outputs with one entry per token besides the 3-D ones ([batch, seq, ...])
PER_TOKEN_2D = frozenset({"start_logits", "end_logits"})


def buckets_up_to(max_seq: int, buckets: Sequence[int] = BUCKETS) -> tuple[int, ...]:
    """The buckets below max_seq, then max_seq itself (the longest input is one bucket)."""
    return (*(b for b in buckets if b < max_seq), max_seq)


def repeat_rows(inputs: Mapping[str, Tensor], rows: int) -> dict[str, Tensor]:
    """Every tensor's rows repeated cyclically (or cut) to `rows`: a batch of real rows at a
    fixed size, with no all-padding row (whose softmax would see only masked keys)."""
    n = int(inputs["input_ids"].shape[0])
    return {k: v[torch.arange(rows) % n] for k, v in inputs.items()}


class PaddedShapes(nn.Module):
    """Runs `model` only at [batch, bucket] shapes (see the module docstring).

    buckets=None: any sequence length from min_seq up passes unpadded (a package exported
    with a dynamic sequence length). pad_rows=False: fewer rows than `batch` run as they are
    (a package exported with a dynamic batch); more still run in chunks of `batch`."""

    def __init__(
        self,
        model: Any,
        batch: int,
        buckets: Sequence[int] | None,
        pad_token_id: int = 0,
        min_seq: int = 1,
        pad_rows: bool = True,
    ) -> None:
        super().__init__()
        if batch < 1:
            raise SquantError(f"batch must be >= 1, got {batch}")
        self.model = model
        self.batch = batch
        self.buckets = tuple(sorted(buckets)) if buckets is not None else None
        self.pad_token_id = pad_token_id
        self.min_seq = min_seq
        self.pad_rows = pad_rows

    # the wrapped model's facts, for callers that read them (model_inputs, eval reports)
    @property
    def config(self) -> Any:
        return getattr(self.model, "config", None)

    @property
    def input_names(self) -> Any:
        return getattr(self.model, "input_names", None)

    @property
    def squant_info(self) -> QuantizationRecord | None:
        return record_of(self.model)

    @property
    def model_class(self) -> str:
        return str(getattr(self.model, "model_class", type(self.model).__name__))

    @property
    def max_seq(self) -> int | None:
        """The longest input this runs: the last bucket, else what the model states."""
        return self.buckets[-1] if self.buckets else getattr(self.model, "max_seq", None)

    def seq_for(self, seq: int) -> int:
        if self.buckets is None:
            return max(seq, self.min_seq)
        for b in self.buckets:
            if seq <= b:
                return b
        raise SquantError(
            f"sequence length {seq} exceeds the longest compiled shape ({self.buckets[-1]})"
        )

    def pad(self, inputs: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """inputs ([rows <= batch, seq]) padded to [batch, seq_for(seq)]."""
        rows, seq = inputs["input_ids"].shape
        if rows > self.batch:
            raise SquantError(f"{rows} rows exceed the fixed batch {self.batch}")
        target = self.seq_for(seq)
        out = {}
        for name, t in inputs.items():
            if target > seq:
                fill = self.pad_token_id if name == "input_ids" else 0
                t = nn.functional.pad(t, (0, target - seq), value=fill)
            out[name] = t
        # repeat real rows (cyclically): no all-masked row runs
        return repeat_rows(out, self.batch) if rows < self.batch and self.pad_rows else out

    def _cut(self, out: Any, rows: int, seq: int) -> dict[str, Tensor]:
        cut = {}
        for name, t in named_tensors(out).items():
            t = t[:rows]
            if t.dim() >= 3 or name in PER_TOKEN_2D:
                t = t[:, :seq]
            cut[name] = t
        return cut

    @torch.no_grad()
    def forward(self, **inputs: Tensor) -> NamedOutputs:
        rows, seq = inputs["input_ids"].shape
        parts = []
        for start in range(0, rows, self.batch):
            chunk = {k: v[start : start + self.batch] for k, v in inputs.items()}
            n = chunk["input_ids"].shape[0]
            exact = (n == self.batch or not self.pad_rows) and self.seq_for(seq) == seq
            out = self.model(**(chunk if exact else self.pad(chunk)))
            parts.append(self._cut(out, n, seq))
        if len(parts) == 1:
            return NamedOutputs(parts[0])
        return NamedOutputs({k: torch.cat([p[k] for p in parts]) for k in parts[0]})


# the sequence length a measurement uses when none is given (fewer where the model has fewer
# positions)
DEFAULT_SEQ = 256
# tokens per measured batch: beyond this a "size" is a typo that would try to allocate GBs
MAX_BATCH_TOKENS = 1 << 20


def fitted_shape(model: Any, batch: int, seq: int | None) -> tuple[int, int]:
    """A measured shape (--batch, --seq) checked against the model before anything is built:
    seq defaults to DEFAULT_SEQ or the model's positions, whichever is fewer; more than the
    model's positions, or a batch beyond MAX_BATCH_TOKENS tokens, is a one-line error."""
    positions = max_positions(model)
    seq = min(DEFAULT_SEQ, positions) if seq is None else seq
    if seq > positions:
        raise SquantError(f"--seq {seq} exceeds the model's {positions} positions")
    if batch * seq > MAX_BATCH_TOKENS:
        raise SquantError(
            f"--batch {batch} x --seq {seq} is {batch * seq} tokens; at most {MAX_BATCH_TOKENS}"
        )
    return batch, seq

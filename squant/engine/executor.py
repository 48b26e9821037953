"""What runs the engine's padded batches: the seam between batching and execution.

An executor takes one padded batch (numpy token ids, attention mask, segment ids) and returns
its rows: pooled embeddings or a head's logits [batch, dim], or with per_token the last
hidden state [batch, width, dim]. The engine (admission, the bucketed queue, the workers)
calls it and knows nothing else of the model. LocalExecutor runs the batch in this process;
engine.model_process.ModelProcess runs it in a child process that holds the model."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from ..quant.mappings import model_inputs
from ..runtime.outputs import mean_pool


class Executor(Protocol):
    # True: the batch computes in the calling thread, so the engine pins each worker to its
    # instance's cores; False: the worker only waits (on a pipe), kept off those cores
    in_process: bool

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray, per_token: bool = False
    ) -> Any: ...

    def seal(self) -> None:
        """From now on never compile (a shape no graph covers runs eagerly, and is counted)."""

    @property
    def refused_recompiles(self) -> int:
        """Calls after seal() that would have compiled."""
        ...

    def alive(self) -> bool: ...

    def close(self) -> None: ...


class LocalExecutor:
    """The batch through a runner in this process: the model itself, or a compiled or
    packaged form of it (which the model still describes: task, inputs, pooling)."""

    in_process = True

    def __init__(self, model: nn.Module, runner: Any, task: str, pooling: str) -> None:
        self.model, self.runner, self.task, self.pooling = model, runner, task, pooling

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray, per_token: bool = False
    ) -> Tensor:
        ids_t, mask_t, types_t = (torch.from_numpy(a) for a in (ids, mask, types))
        inputs = {"input_ids": ids_t, "attention_mask": mask_t, "token_type_ids": types_t}
        with torch.no_grad():
            out = self.runner(**model_inputs(self.model, inputs))
            if self.task != "embed":
                return out.logits.float()
            h = out.last_hidden_state
            if per_token:
                return h.float()
            if self.pooling == "cls":
                return h[:, 0].float()
            return mean_pool(h, mask_t)

    def seal(self) -> None:
        seal = getattr(self.runner, "seal", None)
        if seal is not None:
            seal()

    @property
    def refused_recompiles(self) -> int:
        return int(getattr(self.runner, "refused_recompiles", 0))

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        pass

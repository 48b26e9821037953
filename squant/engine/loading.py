"""The model behind an engine, from whatever directory a user has: a deploy directory from
`squant export` (its AOTInductor package), a directory from `squant quantize` / `squant.save`
(a sentence-transformers one serves its inner model with its own pooling), or a float
Hugging Face checkpoint, run in this process (local_engine.py) or in a model process of its
own (model_process.py). Shared by `squant serve` and `squant embed`."""

from __future__ import annotations

from pathlib import Path

from ..checkpoint.sentence_transformer import sentence_settings, stated_length
from ..errors import SquantError
from .config import ServeConfig
from .engine import Engine


def truncation_stated(path: str | Path, pooling_from: str | Path | None = None) -> int | None:
    """Where the model directory at `path` truncates inputs, as its files state (the Engine's
    stated_length), without loading the model; None: at the model's positions."""
    from ..checkpoint.models import load_tokenizer

    st = sentence_settings(pooling_from or path)
    return stated_length(load_tokenizer(path), st.max_seq_length)


def model_process_pays(
    path: str | Path,
    config: ServeConfig,
    calib: str | Path | None = None,
    ray: bool = False,
) -> bool:
    """Whether a model process is worth its second process here (`--model-process auto`):
    where the instances leave a core to the HTTP front end (served/bench 0.94x against 0.84x
    in one process, docs/serving.md), and where it applies: not for a deploy directory, a
    float checkpoint quantized at start-up (calib), range watching or Ray replicas."""
    from ..checkpoint.source import source_kind
    from ..runtime.placement import front_end_cores, plan

    if ray or calib is not None or config.watch_ranges or source_kind(path) == "deploy":
        return False
    return bool(front_end_cores(plan(config.instances, config.cores_per_instance)))


def engine_for(
    path: str | Path,
    config: ServeConfig,
    pooling_from: str | Path | None = None,
    calib: str | Path | None = None,
) -> Engine:
    """An Engine (not started) for the model directory at `path`. calib: texts to quantize a
    float checkpoint with at start-up (static INT8, squant's defaults; the report is kept as
    engine.quantize_report); without it a float checkpoint is served in FP32.
    config.runtime decides whether the model is compiled first (engine/runtime.py)."""
    from ..checkpoint.models import load_tokenizer
    from ..checkpoint.source import source_kind
    from .local_engine import local_engine

    path = Path(path)
    if pooling_from is not None and not Path(pooling_from).is_dir():
        raise SquantError(f"--pooling-from {pooling_from} is not a directory")
    packaged = source_kind(path) == "deploy"  # already compiled
    if config.model_process:
        # the child loads (and compiles) the model; this process only needs its description:
        # loading it here too cost ~350 MB (sentence-transformers and what it imports)
        from .model_process import ModelProcess

        if packaged:
            raise SquantError(
                "--model-process serves directories from squant quantize / squant.save and "
                "float checkpoints, not deploy directories"
            )
        if calib is not None:
            raise SquantError(
                "--model-process serves a quantized directory: run squant quantize first, then "
                "serve its output (--calib would quantize in both processes)"
            )
        tokenizer = load_tokenizer(path)  # its errors before a process is started
        st = sentence_settings(pooling_from or path)
        remote = ModelProcess(path, config, pooling_from)
        return Engine(
            remote.description,
            tokenizer,
            config,
            st.pooling,
            st.normalize,
            max_length=st.max_seq_length,
            executor=remote,
        )
    return local_engine(path, config, pooling_from, calib)

"""An Engine whose model runs in this process, from whatever directory a user has: a deploy
directory from `squant export` (its AOTInductor package), a directory from `squant quantize` /
`squant.save` (a sentence-transformers one serves its inner model with its own pooling), or a
float Hugging Face checkpoint (quantized at start-up with calib, else served in FP32).
engine/loading.py chooses between this and a model process; the model process builds its
engine with this."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import nn

from ..checkpoint.sentence_transformer import sentence_settings
from ..errors import SquantError
from .config import ServeConfig
from .engine import Engine
from .runtime import compiled_runner, packaged_model, wants_compiled


def local_engine(
    path: str | Path,
    config: ServeConfig,
    pooling_from: str | Path | None = None,
    calib: str | Path | None = None,
) -> Engine:
    """An Engine (not started) over the model at `path`, loaded (and compiled, as
    config.runtime says: engine/runtime.py) in this process."""
    from ..checkpoint.models import load_tokenizer
    from ..checkpoint.source import load_encoder, source_kind
    from ..runtime.export import load_packaged, padded_for_serving
    from ..runtime.placement import plan

    path = Path(path)
    tokenizer = load_tokenizer(path)
    kind = source_kind(path)
    packaged = kind == "deploy"  # already compiled
    if calib is not None and kind != "float":
        raise SquantError(f"{path} is already quantized; --calib is for float checkpoints")
    report = None
    if packaged:
        # a deploy directory: the AOTInductor package (no Python between kernels), any batch
        # if exported with a dynamic batch, else its exported batch (smaller ones are padded).
        # Run by squant's kernel library the call releases the GIL; by torch's binding (a
        # deploy directory without the library) instances take turns: give one all the cores.
        placement = plan(config.instances, config.cores_per_instance)
        package = load_packaged(path, num_runners=placement.instances)
        m = package.exported.manifest
        pad = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        model: nn.Module = padded_for_serving(package, pad)
        if not m["dynamic_batch"]:
            # a bigger batch would run as serial chunks
            batch = min(config.max_batch_requests, int(m["batch"]))
            config = dataclasses.replace(config, max_batch_requests=batch)
    elif calib is not None:
        from ..checkpoint.pipeline import quantize_checkpoint

        quantized = quantize_checkpoint(path, calib)
        model, report = quantized.encoder, quantized.report
    else:
        model = load_encoder(path)  # pooling etc. from the directory: sentence_settings
    st = sentence_settings(pooling_from or path)
    runner = None
    if not packaged and wants_compiled(config.runtime, model, config.watch_ranges):
        placement = plan(config.instances, config.cores_per_instance)
        threads = placement.cores_per_instance
        served = None
        # a quantized directory: its package, built once and cached (the attention choice
        # is a compile option: naming one compiles)
        if (
            config.runtime in ("auto", "package")
            and config.attention == "auto"
            and kind == "quantized"
        ):
            required = config.runtime == "package"
            served = packaged_model(path, model, tokenizer, threads, placement.instances, required)
        if served is not None:
            model = served
        else:
            required = config.runtime == "compiled"
            built = compiled_runner(model, tokenizer, threads, required, config.attention)
            if built is not None:
                model, runner = built
    engine = Engine(
        model,
        tokenizer,
        config,
        st.pooling,
        st.normalize,
        runner=runner,
        max_length=st.max_seq_length,
    )
    engine.quantize_report = report
    return engine

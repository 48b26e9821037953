"""A checkpoint quantized from calibration texts in one call, with the report `squant quantize`
and `squant export` print: what `quantize` does on tokens, done from files.

    result = quantize_checkpoint("all-MiniLM-L6-v2/", "calib.txt", SmoothQuantConfig())
    print(*result.report.lines(), sep="\\n")

A sentence-transformers directory comes back as a SentenceTransformer (its pooling and
normalisation kept) when sentence-transformers is installed. The last `holdout` calibration
texts are never calibrated on: the quantized model is compared with FP32 on them (per-input
cosine of the main output over real tokens), so the report says how close it is before
anyone deploys it.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .. import data
from ..errors import SquantError
from ..quant.config import SmoothQuantConfig
from ..quant.mappings import max_positions, model_inputs
from ..quant.record import Coverage, record_of
from ..runtime.compiler import agreement
from ..runtime.outputs import first_tensor
from . import models, sentence_transformer
from .quantize_api import quantize


@dataclass(frozen=True)
class CalibrationSettings:
    size: int = 256  # texts calibrated on
    batch_size: int = 16
    max_length: int | None = None  # tokens per text; default min(128, the model's limit)
    coverage: bool = True  # add empty / 1-5 word / packed documents (see data.tokenize)
    coverage_length: int | None = None  # packed document length; default the model's limit
    holdout: int = 32  # texts after the calibration ones, scored against FP32 (0: none)


@dataclass
class QuantizeReport:
    """What a quantization did and how close it stayed to FP32 (the typed quantize summary)."""

    model_class: str
    mode: str
    linears: int
    seconds: float
    alpha: dict[str, float]  # min / median / max over the quantized linears
    static_linears: int
    calibration: Coverage | None  # sequences, lengths seen (the record's coverage)
    holdout_texts: int = 0
    cosine_mean: float | None = None  # per held-out input, main output vs FP32
    cosine_min: float | None = None
    size_mib: dict[str, float] = field(default_factory=dict)  # "before", "after" on disk
    outlier_linears: int = 0  # linears with float outlier channels beside the int8 GEMM
    outlier_channels: int = 0  # per such linear

    def lines(self) -> list[str]:
        a = self.alpha
        out = [
            f"quantized {self.linears} linears of {self.model_class} ({self.mode}; "
            f"{self.static_linears} static) in {self.seconds:.1f} s; alpha min/median/max "
            f"{a['min']:.2f}/{a['median']:.2f}/{a['max']:.2f}",
        ]
        if self.outlier_linears:
            out.append(
                f"{self.outlier_channels} outlier input channels in float at "
                f"{self.outlier_linears} linears"
            )
        if self.calibration is not None:
            c = self.calibration
            out.append(
                f"calibrated on {c.sequences} sequences of {c.min_length}-{c.max_length} tokens"
            )
        if self.cosine_mean is not None:
            out.append(
                f"vs FP32 on {self.holdout_texts} held-out texts: cosine mean "
                f"{self.cosine_mean:.5f}, min {self.cosine_min:.5f}"
            )
        if self.size_mib:
            sizes = ", ".join(f"{k} {v:.1f} MiB" for k, v in self.size_mib.items())
            out.append(f"size on disk: {sizes}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Quantized:
    model: Any  # the HF model, or a SentenceTransformer around it
    tokenizer: Any
    report: QuantizeReport

    @property
    def encoder(self) -> nn.Module:
        """The quantized Hugging Face model (inside the SentenceTransformer, if any)."""
        if sentence_transformer.is_sentence_transformer(self.model):
            return sentence_transformer.inner_model(self.model)
        return self.model


def per_input_cosine(reference: Tensor, output: Tensor, mask: Tensor) -> list[float]:
    """Cosine of each input's output with the reference's, over its real tokens (the
    compile guard's measure, compiler.agreement, one input at a time)."""
    return [
        agreement(reference[i : i + 1], output[i : i + 1], mask[i : i + 1])
        for i in range(reference.shape[0])
    ]


@torch.no_grad()
def _outputs(model: nn.Module, batches: list[dict[str, Tensor]]) -> list[Tensor]:
    return [first_tensor(model(**model_inputs(model, b))).float() for b in batches]


def weights_mib(directory: str | Path) -> float:
    files = [p for p in Path(directory).glob("*") if p.suffix in (".safetensors", ".bin", ".pt2")]
    return sum(p.stat().st_size for p in files) / 2**20


def quantize_checkpoint(
    checkpoint: str | Path,
    calib: str | Path,
    config: SmoothQuantConfig | None = None,
    settings: CalibrationSettings | None = None,
    task: str = "auto",
    progress: bool = True,
) -> Quantized:
    """Load a float checkpoint (directory or Hub id), calibrate on texts from `calib`, and
    quantize; the report compares with FP32 on held-out texts."""
    config = config or SmoothQuantConfig()
    s = settings or CalibrationSettings()
    checkpoint = models.resolve(checkpoint)
    models.load_config(checkpoint)  # a bad checkpoint is named before the texts are read
    texts = data.read_texts(calib, limit=s.size + s.holdout)
    calib_texts, held = texts[: s.size], texts[s.size :]
    if not held and s.holdout and len(texts) > 8:  # a short file: hold out its last eighth
        cut = len(texts) - max(1, len(texts) // 8)
        calib_texts, held = texts[:cut], texts[cut:]
    st = None
    if task == "auto" and sentence_transformer.is_sentence_transformer_dir(checkpoint):
        st = sentence_transformer.load_float(checkpoint)
        if st is None:
            print(
                "note: a sentence-transformers directory, but sentence-transformers is not "
                "installed: quantizing its Hugging Face model only (pip install 'squant[st]' "
                "to keep its pooling and normalisation)",
                file=sys.stderr,
            )
    model = (
        sentence_transformer.inner_model(st)
        if st is not None
        else models.load_model(checkpoint, task)
    )
    limit = max_positions(model)
    if st is not None and st.max_seq_length:
        # sentence-transformers truncates there (256 for all-MiniLM-L6-v2 of 512 positions):
        # calibrate on what it will see, and keep its tokenizer, which carries that length
        # into the saved directory (the server truncates where it says)
        limit = min(limit, st.max_seq_length)
    max_length = s.max_length or min(128, limit)
    if max_length > limit:
        raise SquantError(f"--max-length {max_length} exceeds the model's {limit} positions")
    tokenizer = st.tokenizer if st is not None else models.load_tokenizer(checkpoint)
    coverage = min(s.coverage_length or limit, limit) if s.coverage else None
    batches = data.tokenize(tokenizer, calib_texts, s.batch_size, max_length, coverage)
    held_batches = data.tokenize(tokenizer, held, s.batch_size, max_length) if held else []
    reference = _outputs(model, held_batches)  # before the model is quantized in place

    t0 = time.perf_counter()
    quantized = quantize(st if st is not None else model, config, batches, inplace=True)
    seconds = time.perf_counter() - t0
    result = Quantized(quantized, tokenizer, None)  # type: ignore[arg-type]
    encoder = result.encoder
    info = record_of(encoder)
    assert info is not None  # quantize() sets it
    cos = [
        c
        for ref, out, b in zip(
            reference, _outputs(encoder, held_batches), held_batches, strict=True
        )
        for c in per_input_cosine(ref, out, b["attention_mask"])
    ]
    result.report = QuantizeReport(
        model_class=type(encoder).__name__,
        mode=config.mode,
        linears=len(info.modules),
        seconds=seconds,
        alpha=info.alpha_summary(),
        static_linears=info.count("static"),
        outlier_linears=sum(m.outliers > 0 for m in info.modules.values()),
        outlier_channels=max((m.outliers for m in info.modules.values()), default=0),
        calibration=info.calibration,
        holdout_texts=len(held),
        cosine_mean=statistics.fmean(cos) if cos else None,
        cosine_min=min(cos) if cos else None,
        size_mib={"before": weights_mib(checkpoint)},
    )
    return result


@dataclass
class Exported:
    source: Path  # the model directory exported (a Hub id resolved to its local copy)
    package: Path  # the .pt2 inside the deploy directory
    model_class: str
    seconds: float  # the export and package build alone
    report: QuantizeReport | None  # when a float checkpoint was quantized first


def export_checkpoint(
    source: str | Path,
    out: str | Path,
    calib: str | Path | None = None,
    config: SmoothQuantConfig | None = None,
    settings: CalibrationSettings | None = None,
    task: str = "auto",
    export_config: Any = None,
    overwrite: bool = False,
    say: Callable[[str], None] | None = None,
) -> Exported:
    """A deploy directory (AOTInductor package, manifest, tokenizer) at `out` from a directory
    written by squant quantize / squant.save, or from a float checkpoint quantized first on
    the texts in `calib`. A sentence-transformers model exports its inner Hugging Face model
    (its pooling and normalisation are read from the directory apart). say: gets the
    quantization report's lines as soon as there is one, before the (longer) export."""
    from ..files import check_output_dir
    from ..runtime.export import MANIFEST, ExportConfig, export
    from .source import load_encoder, source_kind

    given, source = source, Path(source)
    quantized_dir = source_kind(source) == "quantized"
    if not quantized_dir:
        source = models.resolve(given)
        models.load_config(source)
        if calib is None:
            raise SquantError(
                f"{given} is a float checkpoint: pass --calib TEXTS to quantize it, or "
                "export a directory written by squant quantize"
            )
    check_output_dir(out, MANIFEST, [source], overwrite)
    report = None
    if quantized_dir:
        model, tokenizer = load_encoder(source), models.load_tokenizer(source)
    else:
        assert calib is not None
        result = quantize_checkpoint(source, calib, config, settings, task)
        model, tokenizer, report = result.encoder, result.tokenizer, result.report
        if say is not None:
            for line in report.lines():
                say(line)
    t0 = time.perf_counter()
    package = export(
        model, out, None, tokenizer, export_config or ExportConfig(), overwrite=overwrite
    )
    return Exported(source, package, type(model).__name__, time.perf_counter() - t0, report)

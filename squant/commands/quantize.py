"""`squant quantize`: SmoothQuant INT8 a checkpoint and save it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import SquantError
from .common import add_config_arguments, config_from_args, positive_int

HELP = "SmoothQuant INT8 a checkpoint and save it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        help="Hugging Face checkpoint: a local directory or a Hub id (sentence-transformers "
        "directories keep their pooling and normalisation)",
    )
    p.add_argument("--calib", required=True, help="calibration texts (.txt, .tsv or .jsonl)")
    p.add_argument("--out", required=True, help="output directory for the quantized model")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out even when it holds files squant did not write",
    )
    p.add_argument("--task", default="auto", help="head to load (auto = the checkpoint's own)")
    p.add_argument(
        "--calib-size", type=positive_int, default=256, help="texts used for calibration"
    )
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        help="tokens per calibration text (default: 128, or the model's limit if smaller)",
    )
    p.add_argument(
        "--coverage-length",
        type=positive_int,
        default=None,
        help="also calibrate on empty/1-5-word inputs and on the texts packed into documents of "
        "this many tokens (default: the model's limit)",
    )
    p.add_argument("--no-coverage", action="store_true", help="calibrate on the given texts only")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> None:
    from .. import data, models, sentence_transformer
    from ..files import check_output_dir
    from ..mappings import max_positions
    from ..quantize import quantize
    from ..serialization import CONFIG_FILE, save

    config = config_from_args(args)
    args.checkpoint = str(models.resolve(args.checkpoint))  # a Hub id becomes its cache folder
    models.load_config(args.checkpoint)  # a bad checkpoint is named before a bad --out
    # every reason the output would be refused, found before minutes of calibration
    check_output_dir(args.out, CONFIG_FILE, [args.checkpoint], args.overwrite)
    texts = data.read_texts(args.calib, limit=args.calib_size)
    st = None
    if args.task == "auto" and sentence_transformer.is_sentence_transformer_dir(args.checkpoint):
        st = sentence_transformer.load_float(args.checkpoint)
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
        else models.load_model(args.checkpoint, args.task)
    )
    limit = max_positions(model)
    max_length = args.max_length or min(128, limit)
    if max_length > limit:
        raise SquantError(f"--max-length {max_length} exceeds the model's {limit} positions")
    tokenizer = models.load_tokenizer(args.checkpoint)
    coverage = None if args.no_coverage else min(args.coverage_length or limit, limit)
    batches = data.tokenize(tokenizer, texts, args.batch_size, max_length, coverage)
    quantized = quantize(st if st is not None else model, config, batches, inplace=True)
    out = save(
        quantized,
        args.out,
        tokenizer=tokenizer,
        overwrite=args.overwrite,
        protect=(args.checkpoint,),
    )
    qmodel = sentence_transformer.inner_model(quantized) if st is not None else quantized
    n = len(qmodel.squant_info["modules"])
    seen = qmodel.squant_info["calibration"]
    size = sum(f.stat().st_size for f in Path(out).glob("*.safetensors")) / 2**20
    print(
        f"quantized {n} linears of {type(qmodel).__name__} ({config.mode}, alpha={config.alpha}) "
        f"with {len(texts)} calibration texts ({seen['sequences']} sequences of "
        f"{seen['min_length']}-{seen['max_length']} tokens) -> {out} ({size:.1f} MiB)"
        + ("; a SentenceTransformer: load it with squant.load" if st is not None else "")
    )

"""sentence-transformers models in squant: quantize, save and load them as what they are.

    st = SentenceTransformer("all-MiniLM-L6-v2/")
    q = squant.quantize(st, SmoothQuantConfig(), calibration)   # a SentenceTransformer again
    q.encode(["a sentence"])                                     # pooling, normalising unchanged
    squant.save(q, "minilm-int8/"); q2 = squant.load("minilm-int8/")

Only the transformer inside is quantized (its Hugging Face model); pooling, normalisation,
prompts and the similarity function stay as they were. A saved directory is the
sentence-transformers layout (modules.json, sentence_bert_config.json, 1_Pooling/ ...) with
squant's files at the transformer's place (squant.json, model.safetensors, tokenizer) and no
config.json there; modules.json declares squant's module for the transformer (st_module.py),
so `SentenceTransformer(dir)` alone refuses it with a message naming squant's class instead of
loading INT8 tensors into a float model, and `SentenceTransformer(dir, trust_remote_code=True)`
loads it through `squant.load(dir)`.

sentence-transformers builds its Transformer module only from a float checkpoint on disk, so
loading builds it from a stand-in (the real config with no layers and a 2-token vocabulary,
a few hundred KB in a temporary directory) and then puts the INT8 model in its place.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import SquantError, first_line
from ..quant.mappings import hf_config

MODULES_FILE = "modules.json"
# files of the transformer's place that belong to the float checkpoint, never copied over
_FLOAT_MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")


def is_sentence_transformer(model: Any) -> bool:
    """A SentenceTransformer (or CrossEncoder-like module list) whose first module wraps a
    Hugging Face model; checked by shape, so squant imports sentence-transformers lazily."""
    first = next(iter(model), None) if isinstance(model, nn.Sequential) else None
    return first is not None and isinstance(getattr(first, "auto_model", None), nn.Module)


def is_sentence_transformer_dir(directory: str | Path) -> bool:
    return (Path(directory) / MODULES_FILE).is_file()


def inner_model(st: Any) -> nn.Module:
    return st[0].auto_model


def _set_inner(st: Any, model: nn.Module) -> None:
    # sentence-transformers 5+ keeps the HF model as `model` (`auto_model` reads it)
    module = st[0]
    if hasattr(module, "model"):
        module.model = model
    else:
        module.auto_model = model


def with_inner(st: Any, model: nn.Module) -> Any:
    """A copy of the SentenceTransformer with its Hugging Face model replaced (the old one is
    not copied)."""
    import copy

    old = inner_model(st)
    memo = {id(old): model}  # deepcopy everything else, put `model` in the old one's place
    return copy.deepcopy(st, memo)


MIN_ST_MAJOR = 6


def _require() -> Any:
    try:
        import sentence_transformers
    except ImportError:
        raise SquantError(
            "this is a sentence-transformers model: pip install 'squant[st]' to load it"
        ) from None
    version = str(getattr(sentence_transformers, "__version__", "0"))
    if int(version.split(".")[0] or 0) < MIN_ST_MAJOR:
        # 5.x imports custom modules a local modules.json names without asking: loading a
        # crafted directory would run its code. 6.x refuses them unless trust_remote_code.
        raise SquantError(
            f"sentence-transformers {version} runs code named in a directory's modules.json; "
            f"squant needs >= {MIN_ST_MAJOR}.0: pip install 'sentence-transformers>={MIN_ST_MAJOR}'"
        )
    return sentence_transformers


def _transformer_place(directory: Path) -> None:
    """squant keeps the INT8 model at the directory's root: the transformer must live there
    (what sentence-transformers itself writes)."""
    try:
        modules = json.loads((directory / MODULES_FILE).read_text())
        place = next(m["path"] for m in modules if m["idx"] == 0)
    except (OSError, ValueError, KeyError, TypeError, StopIteration, RecursionError) as e:
        raise SquantError(
            f"{directory / MODULES_FILE} is not a sentence-transformers module list ({e})"
        ) from None
    if place != "":
        raise SquantError(
            f"{directory}: the transformer module lives in {place!r}; squant supports "
            "sentence-transformers directories with the transformer at the root"
        )


# modules.json: the type squant declares for the transformer (st_module.py), and the key
# that keeps the type sentence-transformers wrote, which squant.load puts back
DECLARED_TYPE = "squant.st_module.Int8Transformer"
ORIGINAL_TYPE_KEY = "squant_original_type"
_DEFAULT_TRANSFORMER = "sentence_transformers.models.Transformer"


def _declare_int8_module(directory: Path) -> None:
    """Module 0 of directory's modules.json becomes squant's declared module (st_module.py),
    keeping the type it had under ORIGINAL_TYPE_KEY."""
    path = directory / MODULES_FILE
    modules = json.loads(path.read_text())
    first = next(m for m in modules if m["idx"] == 0)
    first[ORIGINAL_TYPE_KEY] = first.get("type", _DEFAULT_TRANSFORMER)
    first["type"] = DECLARED_TYPE
    path.write_text(json.dumps(modules, indent=2))


def _undeclare_int8_module(directory: Path) -> None:
    """The inverse, for the copy squant.load builds its SentenceTransformer from; only a
    sentence-transformers class is put back (anything else could name code to run)."""
    path = directory / MODULES_FILE
    modules = json.loads(path.read_text())
    first = next(m for m in modules if m["idx"] == 0)
    if first.get("type") != DECLARED_TYPE:
        return  # saved before squant declared its module
    original = first.pop(ORIGINAL_TYPE_KEY, None)
    ok = isinstance(original, str) and original.startswith("sentence_transformers.")
    first["type"] = original if ok else _DEFAULT_TRANSFORMER
    path.write_text(json.dumps(modules, indent=2))


def save_files(st: Any, directory: Path) -> None:
    """Everything of the SentenceTransformer but its transformer's weights, into directory
    (which squant.save fills with the INT8 model): written by sentence-transformers itself
    for a copy around a stand-in model, then moved over without the stand-in's files; the
    transformer declared as squant's module (st_module.py)."""
    with tempfile.TemporaryDirectory(prefix="squant-st-") as scratch:
        with_inner(st, _stand_in(inner_model(st).config)).save(scratch)
        _transformer_place(Path(scratch))
        _declare_int8_module(Path(scratch))
        for item in Path(scratch).iterdir():
            target = directory / item.name
            if item.name not in _FLOAT_MODEL_FILES and not target.exists():  # squant's win
                shutil.move(str(item), str(target))


def _stand_in(config: Any) -> Any:
    """The float model sentence-transformers is built around at load: the real config with
    no layers and a 2-token vocabulary (its weights are never used)."""
    import transformers

    small = config.__class__.from_dict({**config.to_dict(), "vocab_size": 2})
    for key in ("num_hidden_layers", "n_layers"):
        if hasattr(small, key):
            setattr(small, key, 0)
    return transformers.AutoModel.from_config(small).eval()


def load_float(directory: str | Path) -> Any | None:
    """The float SentenceTransformer in a local directory; None when sentence-transformers is
    not installed (the caller then works on the Hugging Face model alone and says so)."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return None
    sentence_transformers = _require()  # installed: its version is checked
    _transformer_place(Path(directory))
    try:
        return sentence_transformers.SentenceTransformer(
            str(directory), device="cpu", local_files_only=True
        ).eval()
    except Exception as e:  # sentence-transformers raises many kinds
        first = first_line(e)[:300]
        raise SquantError(f"cannot load {directory} as a SentenceTransformer: {first}") from None


def load(directory: str | Path, model: nn.Module) -> Any:
    """The SentenceTransformer saved in directory, around `model` (squant.load's INT8 model)."""
    st_lib = _require()
    directory = Path(directory)
    _transformer_place(directory)
    with tempfile.TemporaryDirectory(prefix="squant-st-") as scratch:
        root = str(directory)
        skip = lambda folder, names: (  # noqa: E731  squant's INT8 files, not the modules'
            [n for n in names if n.endswith(".safetensors") or n == "squant.json"]
            if folder == root
            else []
        )
        shutil.copytree(directory, scratch, dirs_exist_ok=True, ignore=skip)
        _undeclare_int8_module(Path(scratch))
        _stand_in(hf_config(model)).save_pretrained(scratch)
        try:
            st = st_lib.SentenceTransformer(scratch, device="cpu", local_files_only=True)
        except Exception as e:  # sentence-transformers raises many kinds
            first = first_line(e)[:300]
            raise SquantError(
                f"cannot load {directory} as a SentenceTransformer: {first}"
            ) from None
    _set_inner(st, model)
    return st.eval()


def quantize(st: Any, config: Any, calibration: Any, inplace: bool, progress: bool) -> Any:
    """squant.quantize of a SentenceTransformer: its HF model quantized, the rest kept.
    calibration may be texts here (tokenized by the model's own tokenizer, with squant's
    coverage inputs, as `squant quantize` does) besides tokenizer outputs."""
    from ..data import tokenize
    from ..quant.mappings import max_positions
    from ..quant.quantize import quantize_encoder

    inner = inner_model(st)
    items = list(calibration) if calibration is not None else []
    if items and all(isinstance(t, str) for t in items):
        limit = min(max_positions(inner), st.max_seq_length or max_positions(inner))
        items = tokenize(st.tokenizer, items, 16, min(128, limit), coverage_length=limit)
    q = quantize_encoder(inner, config, items, inplace=inplace, progress=progress)
    if inplace:
        _set_inner(st, q)
        return st
    return with_inner(st, q)


@dataclass(frozen=True)
class SentenceSettings:
    """What a sentence-transformers directory says about serving its model: the pooling, whether
    it normalizes, and max_seq_length (where it truncates, often below the model's positions:
    256 for all-MiniLM-L6-v2, whose BERT has 512). Directories written before
    sentence-transformers 6 keep it in sentence_bert_config.json, read here; later ones in the
    tokenizer's model_max_length, which the Engine reads. A server that truncated at 512 instead
    embeds long texts unlike sentence-transformers does (real MiniLM, a 600-word text: cosine
    0.64 against ST's own output)."""

    pooling: str = "mean"
    normalize: bool = False
    max_seq_length: int | None = None


def sentence_settings(path: str | os.PathLike[str] | None) -> SentenceSettings:
    """The SentenceSettings of a sentence-transformers directory; the defaults (mean pooling,
    no normalization, the model's own length) for any other directory."""
    if path is None:
        return SentenceSettings()
    root = Path(path)
    modules = root / "modules.json"
    if not modules.is_file():
        return SentenceSettings()
    pooling, normalize, max_seq_length = "mean", False, None
    try:
        entries = json.loads(modules.read_text())
        for m in entries:
            kind = str(m.get("type", ""))
            if kind.endswith("Normalize"):
                normalize = True
            if kind.endswith("Pooling"):
                cfg = json.loads((root / str(m.get("path", "")) / "config.json").read_text())
                if cfg.get("pooling_mode_cls_token"):
                    pooling = "cls"
        st_config = root / "sentence_bert_config.json"
        if st_config.is_file():
            value = json.loads(st_config.read_text()).get("max_seq_length")
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"max_seq_length {value!r} is not a positive integer")
                max_seq_length = value
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as e:
        raise SquantError(f"{modules}: unreadable sentence-transformers config ({e})") from None
    return SentenceSettings(pooling, normalize, max_seq_length)


def stated_length(tokenizer: Any, max_seq_length: int | None = None) -> int | None:
    """Where a model directory's files say inputs are truncated: sentence-transformers'
    legacy max_seq_length when given, else the tokenizer's model_max_length; None where neither
    says (the model's positions decide; transformers' placeholder for "not set" is 1e30)."""
    if max_seq_length is not None:
        return max_seq_length
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 1_000_000 else None

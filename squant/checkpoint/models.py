"""Loading Hugging Face checkpoints and tokenizers from local directories, with clear errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import safetensors
import torch
import transformers
from torch import nn

from ..errors import SquantError, first_line
from ..quant.mappings import LAYOUTS, SUPPORTED_CLASSES, supported_summary

# Task name -> class-name suffix of the matching transformers head.
TASK_SUFFIXES: dict[str, str] = {
    "base": "Model",
    "sequence-classification": "ForSequenceClassification",
    "question-answering": "ForQuestionAnswering",
    "token-classification": "ForTokenClassification",
    "masked-lm": "ForMaskedLM",
}
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# what a checkpoint needs from the Hub: configs, tokenizers, safetensors weights, the
# sentence-transformers module folders; not the .bin/ONNX/OpenVINO copies many repos also hold
HUB_FILES = ("*.json", "*.txt", "*.model", "*.safetensors", "*/*.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def looks_like_hub_id(name: str) -> bool:
    """`bert-base-uncased` or `org/name`: not a path that exists, not an explicit path."""
    return bool(_HUB_ID.match(name)) and not name.startswith(".") and ".." not in name


def resolve(path: str | Path) -> Path:
    """A local directory, or a Hugging Face Hub id fetched the ordinary way (huggingface_hub's
    cache honoured, HF_HUB_OFFLINE too); a missing path or an unreachable Hub is one line."""
    local = Path(path)
    if local.exists() or not looks_like_hub_id(str(path)):
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path), allow_patterns=list(HUB_FILES)))
    except Exception as e:  # offline, unknown repo, gated: huggingface_hub has many errors
        raise SquantError(
            f"{path} is not a local directory, and fetching it from the Hugging Face Hub failed "
            f"({type(e).__name__}: {first_line(e)[:160]}); offline, pass a local checkpoint "
            "directory or fill the Hub cache first"
        ) from None


def _check_dir(path: str | Path, need_config: bool = True) -> Path:
    path = resolve(path)
    if not path.exists():
        raise SquantError(f"checkpoint directory {path} does not exist")
    if not path.is_dir():
        raise SquantError(f"{path} is not a directory (expected a Hugging Face checkpoint)")
    if need_config and not (path / "config.json").is_file():
        raise SquantError(f"{path} has no config.json: not a Hugging Face checkpoint directory")
    return path


def load_config(path: str | Path) -> Any:
    path = _check_dir(path)
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as e:
        raise SquantError(f"cannot read {path / 'config.json'}: {first_line(e)}") from None
    if config.model_type not in LAYOUTS:
        raise SquantError(
            f"{path}: model_type {config.model_type!r} is not supported; squant supports "
            f"{supported_summary()}"
        )
    return config


def model_class(config: Any, task: str = "auto") -> type[nn.Module]:
    """The transformers class to load: the checkpoint's own head for task="auto"."""
    supported = SUPPORTED_CLASSES[config.model_type]
    if task == "auto":
        declared = [a for a in (config.architectures or []) if a in supported]
        name = declared[0] if declared else supported[0]
    else:
        if task not in TASK_SUFFIXES:
            choices = ", ".join(["auto", *TASK_SUFFIXES])
            raise SquantError(f"unknown task {task!r}; choose from {choices}")
        name = next((c for c in supported if c.endswith(TASK_SUFFIXES[task])), None)
        if name is None:
            raise SquantError(f"no {task} head for model_type {config.model_type!r}")
    return getattr(transformers, name)


def load_model(path: str | Path, task: str = "auto") -> nn.Module:
    """A float32 model in eval mode from a local checkpoint directory."""
    config = load_config(path)
    path = resolve(path)
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise SquantError(f"{path} has no weights ({' or '.join(WEIGHT_FILES[::2])})")
    cls = model_class(config, task)
    try:
        model, info = cast(Any, cls).from_pretrained(
            str(path), dtype=torch.float32, local_files_only=True, output_loading_info=True
        )
    except (OSError, ValueError, RuntimeError, KeyError, safetensors.SafetensorError) as e:
        raise SquantError(f"cannot load weights from {path}: {first_line(e)}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing and model.base_model is not model:
        # transformers would fill a missing head with random weights: scores from it are noise
        raise SquantError(
            f"{path} has no trained weights for {cls.__name__} (missing {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}); its head would be random: use a checkpoint "
            "fine-tuned for this task"
        )
    # absolute: squant.save refuses to write over the checkpoint a model came from, and a
    # relative path would name another directory after a chdir
    model.config._name_or_path = str(Path(path).resolve())
    return model.eval()


TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer saved in a checkpoint (or in a directory written by squant.save)."""
    path = _check_dir(path, need_config=False)
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise SquantError(
            f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES)}); copy the "
            "checkpoint's tokenizer into it (tokenizer.save_pretrained)"
        )
    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SquantError(f"cannot load a tokenizer from {path}: {first_line(e)}") from None

"""AOTInductor packages: a quantized (or float) encoder as one .pt2 file plus a manifest.

    squant.export(qmodel, "deploy/", tokenizer=tok, config=ExportConfig(batch=8, dynamic_seq=True))

The directory holds model.pt2 (AOTInductor: compiled kernels + frozen weights, oneDNN-packed),
manifest.json (architecture, quantization, versions, the CPU ISA it was built for, input and
output names, shapes), the model's config.json and the tokenizer. Running it needs PyTorch only:

    runner = torch._inductor.aoti_load_package("deploy/model.pt2")
    outputs = runner(ids, mask, token_type_ids)   # a tuple of tensors (no segments: 2 inputs)

squant.load_exported() adds checks in front of that: the manifest's schema, format and torch
version; the ISA the package needs; the SHA-256 of model.pt2 recorded at export; every member
of the archive (no absolute paths, no `..`, no links, one root folder: torch's loader extracts
member names as given); and, at every call, the inputs' dtype, rank, batch, sequence length
and token-id range (AOTInductor reads past its buffers on a wrong shape instead of failing).

A model quantized with attention="int8" calls squant's kernel library (one .so), which export
copies beside the package (manifest "kernel_library", with its SHA-256); without squant, load
it first:

    torch.ops.load_library("deploy/squant_kernels.so")

A .pt2 holds compiled native code (a shared library that runs when loaded): like any .so,
load only packages from a source you trust. The checks above catch accidents and tampering
after export (the hash), not a malicious package built with a matching manifest.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import shutil
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import SquantError, first_line
from ..files import atomic_directory, hash_file, read_json_record
from ..hardware import cpu_features
from ..kernels.package_runner import NativePackageRunner
from ..quant.attention import (
    SQUANT_ATTENTION,
    FusedSelfAttention,
    register_squant_attention,
    uses_int8_attention,
)
from ..quant.int8 import make_prepack_traceable
from ..quant.mappings import MODEL_INPUT_KEYS, hf_config, input_names
from ..quant.qlinear import QuantLinear
from ..quant.record import QuantizationRecord, record_of
from ..version import __version__
from .compiler import FLOAT_DTYPES, CompileConfig, FloatDtype, cast_float_parts
from .fusion import INDUCTOR_OPTIONS as FUSION_OPTIONS
from .outputs import NamedOutputs, named_tensors, output_tensors

PACKAGE = "model.pt2"
MANIFEST = "manifest.json"
FORMAT = "squant-aoti"
FORMAT_VERSION = 3  # 2: sha256, vocab_size, max_seq; 3: token_type_ids, output_names, config
READABLE_VERSIONS = (2, 3)
# ISA features a package may need from the host, from the most to the least demanding
# the largest batch a dynamic-batch package takes
MAX_BATCH = 1024
REQUIRED_ISA = ("amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16", "avx512f", "avx2")


class _TupleOutputs(nn.Module):
    """Call positionally and return a plain tuple of tensors (loadable without transformers)."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        inputs = (input_ids, attention_mask, token_type_ids)
        out = self.model(**dict(zip(self.names, inputs, strict=False)))
        return tuple(v.float() if v.is_floating_point() else v for v in output_tensors(out))


@dataclass(frozen=True)
class ExportConfig:
    """What a package is built for.

    batch, seq: the input shape ([batch, seq]); used when no example_inputs are given.
    dynamic_seq: accept any sequence length in [2, the model's limit].
    dynamic_batch: accept any batch in [1, MAX_BATCH] (else exactly `batch`): what a server
        wants, which then sends each batch as it is instead of padding it to `batch`.
    float_dtype: dtype of the non-int8 parts, as in CompileConfig ("auto": FP32 for an INT8
        model, BF16 for a float one where the CPU has native BF16). Attention is squant's
        fused kernel for quantized models.
    """

    batch: int = field(default=1, metadata={"help": "batch the package runs at"})
    seq: int = field(default=128, metadata={"help": "sequence length it runs at"})
    dynamic_seq: bool = field(
        default=False, metadata={"help": "accept any sequence length up to the model's limit"}
    )
    dynamic_batch: bool = field(
        default=False,
        metadata={"help": "accept any batch size (a server then sends each batch unpadded)"},
    )
    float_dtype: FloatDtype = field(
        default="auto",
        metadata={
            "help": "dtype of the float parts (auto: FP32 for an INT8 model; for a float "
            "model BF16 where the CPU has it natively)"
        },
    )

    def __post_init__(self) -> None:
        if self.batch < 1 or self.seq < 2:
            raise SquantError(f"batch must be >= 1 and seq >= 2, got {self.batch} and {self.seq}")
        if self.float_dtype not in FLOAT_DTYPES:
            raise SquantError(f"float_dtype must be auto, bf16 or fp32, got {self.float_dtype!r}")

    def resolved_dtype(self, model: nn.Module | None = None) -> torch.dtype:
        return CompileConfig(float_dtype=self.float_dtype).resolved_dtype(model)


def example_for(model: nn.Module, config: ExportConfig) -> dict[str, Tensor]:
    """Inputs of the config's shape (token ids are placeholders: shapes are what count); a
    dynamic-length package is traced at min(seq, the model's limit)."""
    limit = _max_positions(model)
    if config.seq > limit and not config.dynamic_seq:
        raise SquantError(f"seq {config.seq} exceeds the model's {limit} positions")
    seq = min(config.seq, limit)
    ids = torch.full((config.batch, seq), min(1000, int(hf_config(model).vocab_size) - 1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def export(
    model: nn.Module,
    directory: str | Path,
    example_inputs: Mapping[str, Tensor] | None = None,
    tokenizer: Any = None,
    config: ExportConfig | None = None,
    *,
    overwrite: bool = False,
) -> Path:
    """Build an AOTInductor package for the shapes of example_inputs (input_ids and
    attention_mask, [batch, seq]; token_type_ids too for architectures with segments, zeros
    when absent), or of config.batch x config.seq; with config.dynamic_seq, for any sequence
    length up to the model's limit. The directory is written atomically (squant.files): a
    failed or killed export leaves a previous package intact."""
    config = config or ExportConfig()
    if example_inputs is None:
        example_inputs = example_for(model, config)
    if "input_ids" not in example_inputs or "attention_mask" not in example_inputs:
        raise SquantError("example_inputs needs input_ids and attention_mask")
    if config.dynamic_batch and example_inputs["input_ids"].shape[0] == 1:
        # traced at batch 1, torch.export specializes the batch to 1 ("Constraints
        # violated"): trace a dynamic-batch package at two copies of the row
        example_inputs = {k: v.repeat(2, *([1] * (v.dim() - 1))) for k, v in example_inputs.items()}
    with atomic_directory(directory, MANIFEST, overwrite=overwrite) as tmp:
        _export_into(model, tmp, example_inputs, tokenizer, config)
    return Path(directory) / PACKAGE


def _export_into(
    model: nn.Module,
    directory: Path,
    example_inputs: Mapping[str, Tensor],
    tokenizer: Any,
    config: ExportConfig,
) -> None:
    dynamic_seq = config.dynamic_seq
    dtype = config.resolved_dtype(model)
    work = copy.deepcopy(model).eval()
    if dtype != torch.float32:
        cast_float_parts(work, dtype)
    if uses_int8_attention(work):
        pass  # the package calls squant's kernel library, shipped beside it (below)
    elif any(isinstance(m, FusedSelfAttention) for m in work.modules()):
        register_squant_attention()
        hf_config(work)._attn_implementation = SQUANT_ATTENTION
    make_prepack_traceable()
    for m in work.modules():  # oneDNN's weights are packed in-graph (QuantLinear._packed)
        if isinstance(m, QuantLinear) and m.gemm == "onednn":
            del m._buffers["packed_weight"]
    names = input_names(work)
    ids = example_inputs["input_ids"]
    inputs = tuple(example_inputs.get(n, torch.zeros_like(ids)) for n in names)
    wrapped = _TupleOutputs(work, names).eval()
    dims: dict[int, Any] = {}
    if config.dynamic_batch:
        dims[0] = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    if dynamic_seq:
        dims[1] = torch.export.Dim("seq", min=2, max=_max_positions(work))
    dynamic_shapes = {n: dims for n in names} if dims else None
    with torch.no_grad():  # the original model: `work` no longer packs eagerly
        output_names = list(named_tensors(model(**dict(zip(names, inputs, strict=True)))))
        try:
            program = torch.export.export(
                wrapped, inputs, dynamic_shapes=dynamic_shapes, strict=False
            )
        except Exception as e:  # export failures are long traces; keep the first line
            raise SquantError(f"torch.export failed: {first_line(e)[:300]}") from e
        torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(directory / PACKAGE),
            inductor_configs={"freezing": True, **FUSION_OPTIONS},
        )
    kernel_library = None
    if uses_int8_attention(work) or any(
        isinstance(m, QuantLinear) and m.gemm == "squant" for m in work.modules()
    ):
        kernel_library = {"file": KERNEL_LIBRARY, "sha256": _ship_kernels(directory)}
    cpu = cpu_features()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "squant_version": __version__,
        "torch_version": torch.__version__,
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "quantization": record.to_dict() if (record := record_of(model)) else None,
        "float_dtype": str(dtype).replace("torch.", ""),
        "inputs": list(names),
        "outputs": len(program.graph_signature.user_outputs),
        "output_names": output_names,
        "batch": int(inputs[0].shape[0]),
        "dynamic_batch": config.dynamic_batch,
        "seq": None if dynamic_seq else int(inputs[0].shape[1]),
        "dynamic_seq": dynamic_seq,
        "max_seq": _max_positions(work) if dynamic_seq else int(inputs[0].shape[1]),
        "vocab_size": int(hf_config(model).vocab_size),
        "type_vocab_size": int(getattr(model.config, "type_vocab_size", 1) or 1),
        "sha256": _sha256(directory / PACKAGE),
        "built_on": {"cpu": cpu.model_name, "isa": list(cpu.isa), "int8_path": cpu.int8_path},
        "requires_isa": [f for f in REQUIRED_ISA if cpu.has(f)],
        "kernel_library": kernel_library,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    hf_config(model).save_pretrained(str(directory))  # labels, sizes: what a server reads
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


KERNEL_LIBRARY = "squant_kernels.so"


def _ship_kernels(directory: Path) -> str:
    """Copy squant's kernel library (already loaded: the model ran) into the deploy
    directory; returns its SHA-256."""
    import shutil

    from .. import kernels

    shutil.copyfile(kernels.library_path(), directory / KERNEL_LIBRARY)
    return _sha256(directory / KERNEL_LIBRARY)


def _load_kernels(directory: Path, manifest: dict[str, Any]) -> None:
    """Load the kernel library a package calls, after checking it is the exported one."""
    entry = manifest.get("kernel_library")
    if entry is None:
        return
    path = directory / KERNEL_LIBRARY
    if not path.is_file():
        raise SquantError(f"{directory}: the package needs {KERNEL_LIBRARY}, which is missing")
    if _sha256(path) != entry["sha256"]:
        raise SquantError(
            f"{path} does not match the SHA-256 in the manifest: it changed after export; "
            "export the model again"
        )
    from .. import kernels

    kernels.load_library(path)


def _sha256(path: Path) -> str:
    return str(hash_file(path, hashlib.sha256()).hexdigest())


def _max_positions(model: nn.Module) -> int:
    from ..quant.mappings import max_positions

    return max_positions(model)


def load_exported(directory: str | Path, num_runners: int = 1) -> ExportedModel:
    """The package's runner behind every check listed in this module's docstring.

    num_runners: how many calls may run at once (one per serving thread); the runners share
    one copy of the weights."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not (directory / PACKAGE).is_file() or not manifest_path.is_file():
        raise SquantError(f"{directory} is not a squant export ({PACKAGE} and {MANIFEST} needed)")
    manifest = read_manifest(manifest_path)
    check_host(manifest)
    check_package(directory / PACKAGE, manifest["sha256"])
    _load_kernels(directory, manifest)
    native = _native_runner_loaded()
    from torch._inductor.package import load_package  # type: ignore[attr-defined]

    try:
        with _extraction_directory() as extracted:
            package = str(directory / PACKAGE)
            runner = (
                NativePackageRunner(package, num_runners)
                if native
                else load_package(package, num_runners=num_runners)
            )
    except Exception as e:  # torch raises RuntimeError/OSError/... with long native traces
        raise SquantError(f"cannot load {directory / PACKAGE}: {first_line(e)[:300]}") from None
    # torch removes its own extraction when the runner is freed; squant's directory around it
    weakref.finalize(runner, shutil.rmtree, extracted, True)
    return ExportedModel(runner, manifest)


def _native_runner_loaded() -> bool:
    """Whether squant's GIL-free package runner is loaded (kernels/package_runner.py), loading
    squant's own kernel library for it when that is built already and no library is loaded
    (a package without int8 attention ships none); never builds it."""
    from .. import kernels
    from ..kernels import package_runner

    if not kernels.registered() and kernels.built():
        try:
            kernels.load()
        except SquantError:
            return False
    return package_runner.available()


_TMPDIR_LOCK = threading.Lock()


@contextlib.contextmanager
def _extraction_directory() -> Iterator[str]:
    """A private temporary directory for torch to extract a package into.

    torch's loader extracts the package under the temp directory (TMPDIR) and removes it when
    the runner is destroyed, but not when loading fails: each failed load would leave an
    aotinductor_* directory behind. Under a directory of squant's own, removed here when the
    load fails (and by the caller once the loaded runner is freed)."""
    private = tempfile.mkdtemp(prefix="squant-pt2-")
    with _TMPDIR_LOCK:  # the variable is process-wide: one load at a time changes it
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = private
        try:
            yield private
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        finally:
            if old is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = old


def load_packaged(directory: str | Path, num_runners: int = 1) -> PackagedEncoder:
    """load_exported, called like the Hugging Face model (keyword inputs, named outputs),
    with the model's config from the deploy directory (labels, sizes)."""
    exported = load_exported(directory, num_runners)
    config = None
    if (Path(directory) / "config.json").is_file():
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(str(directory))
        except (OSError, ValueError) as e:
            raise SquantError(f"{directory}/config.json is not a model config: {e}") from None
    return PackagedEncoder(exported, config)


def _typed(manifest: dict[str, Any], key: str, kind: type | tuple[type, ...], where: Path) -> Any:
    value = manifest.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise SquantError(f"{where}: field {key!r} is missing or has the wrong type")
    return value


def read_manifest(path: Path) -> dict[str, Any]:
    """manifest.json, checked: format, version, torch version, and every field's type."""
    manifest = read_json_record(
        path, FORMAT, READABLE_VERSIONS, "a squant export manifest", "; export the model again"
    )
    built = _typed(manifest, "torch_version", str, path)
    if built.split("+")[0] != torch.__version__.split("+")[0]:
        raise SquantError(
            f"{path}: built with torch {built}, this is torch {torch.__version__}; AOTInductor "
            "packages run only on the torch that built them: export again here"
        )
    isa = _typed(manifest, "requires_isa", list, path)
    if not all(isinstance(f, str) and f in REQUIRED_ISA for f in isa):
        raise SquantError(f"{path}: requires_isa must list names from {REQUIRED_ISA}")
    batch = _typed(manifest, "batch", int, path)
    max_seq = _typed(manifest, "max_seq", int, path)
    vocab = _typed(manifest, "vocab_size", int, path)
    dynamic = _typed(manifest, "dynamic_seq", bool, path)
    manifest.setdefault("dynamic_batch", False)  # before dynamic batches: fixed
    _typed(manifest, "dynamic_batch", bool, path)
    seq = manifest.get("seq")
    if dynamic != (seq is None) or not (seq is None or isinstance(seq, int)):
        raise SquantError(f"{path}: seq and dynamic_seq disagree")
    if min(batch, max_seq, vocab) < 1:
        raise SquantError(f"{path}: batch, max_seq and vocab_size must be >= 1")
    sha = _typed(manifest, "sha256", str, path)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise SquantError(f"{path}: sha256 is not a SHA-256 hex digest")
    manifest.setdefault("kernel_library", None)  # before int8 attention: none
    library = manifest["kernel_library"]
    if library is not None and not (
        isinstance(library, dict)
        and library.get("file") == KERNEL_LIBRARY
        and isinstance(library.get("sha256"), str)
        and len(library["sha256"]) == 64
    ):
        raise SquantError(f"{path}: kernel_library must name {KERNEL_LIBRARY} with its SHA-256")
    manifest.setdefault("type_vocab_size", 2)  # version 2 did not record it
    _typed(manifest, "type_vocab_size", int, path)
    names = _typed(manifest, "inputs", list, path)
    if names not in (list(MODEL_INPUT_KEYS[:2]), list(MODEL_INPUT_KEYS)):
        raise SquantError(f"{path}: inputs must be {list(MODEL_INPUT_KEYS[:2])} or with segments")
    outputs = _typed(manifest, "outputs", int, path)
    manifest.setdefault("output_names", [f"output_{i}" for i in range(outputs)])  # version 2
    out_names = _typed(manifest, "output_names", list, path)
    if len(out_names) != outputs or not all(isinstance(n, str) for n in out_names):
        raise SquantError(f"{path}: output_names must name each of the {outputs} outputs")
    return manifest


def check_package(path: Path, sha256: str) -> None:
    """The archive is the one exported (hash), and extracting it cannot write outside its
    own folder: relative member names under one root, no `..`, no links or devices."""
    if _sha256(path) != sha256:
        raise SquantError(
            f"{path} does not match the SHA-256 in the manifest: it changed after export "
            "(corrupt or tampered); export it again"
        )
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as e:
        # a member name flagged UTF-8 whose bytes are not: zipfile's index reader raises
        raise SquantError(f"{path} is not a valid package ({e})") from None
    if not infos:
        raise SquantError(f"{path} is an empty archive")
    root = infos[0].filename.split("/")[0]
    for info in infos:
        name = info.filename
        parts = name.split("/")
        kind = (info.external_attr >> 16) & 0o170000
        if (
            name.startswith(("/", "\\"))
            or "\\" in name
            or ":" in parts[0]
            or parts[0] != root
            or any(p in ("..", ".") for p in parts)
            or "" in parts[:-1]
            or kind not in (0, 0o100000, 0o040000)  # plain files and folders only
        ):
            raise SquantError(f"{path}: unsafe archive member {name!r}; refusing to load it")


class ExportedModel:
    """Calls an AOTInductor package with checked inputs; returns its tuple of tensors.

    runner(input_ids, attention_mask[, token_type_ids]): [batch, seq] integer tensors, batch
    and seq as exported (seq anywhere in [2, max_seq] for a dynamic_seq package), token ids
    in [0, vocab). A package of an architecture with segments takes token_type_ids (zeros
    when omitted); one without refuses non-zero segments rather than ignore them.
    `load_packaged` gives the same package called like the Hugging Face model."""

    def __init__(self, runner: Any, manifest: dict[str, Any]) -> None:
        self.runner = runner
        self.manifest = manifest
        self.input_names = tuple(manifest["inputs"])
        self.output_names = tuple(manifest["output_names"])
        self.type_vocab_size = int(manifest.get("type_vocab_size", 2))

    def _check(self, name: str, t: Any) -> Tensor:
        m = self.manifest
        if not isinstance(t, Tensor):
            raise SquantError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise SquantError(f"{name} must hold integers, got {t.dtype}")
        if t.dim() != 2:
            raise SquantError(f"{name} must be [batch, seq], got shape {tuple(t.shape)}")
        batch, seq = t.shape
        if m["dynamic_batch"]:
            if not 1 <= batch <= MAX_BATCH:
                raise SquantError(f"{name}: batch {batch} outside [1, {MAX_BATCH}]")
        elif batch != m["batch"]:
            raise SquantError(
                f"{name}: this package was exported for batch {m['batch']}, got {batch}"
            )
        if m["dynamic_seq"]:
            if not 2 <= seq <= m["max_seq"]:
                raise SquantError(f"{name}: sequence length {seq} outside [2, {m['max_seq']}]")
        elif seq != m["seq"]:
            raise SquantError(
                f"{name}: this package was exported for sequence length {m['seq']}, got {seq}"
            )
        return t.to(torch.int64).contiguous()

    def __call__(
        self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        ids = self._check("input_ids", input_ids)
        mask = self._check("attention_mask", attention_mask)
        if ids.shape != mask.shape:
            raise SquantError(
                f"input_ids {tuple(ids.shape)} and attention_mask {tuple(mask.shape)} differ"
            )
        if int(ids.min()) < 0 or int(ids.max()) >= self.manifest["vocab_size"]:
            raise SquantError(
                f"input_ids outside [0, {self.manifest['vocab_size']}): wrong tokenizer?"
            )
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise SquantError("attention_mask must hold only 0 and 1")
        inputs = [ids, mask]
        if token_type_ids is not None:
            types = self._check("token_type_ids", token_type_ids)
            if types.shape != ids.shape:
                raise SquantError(f"token_type_ids {tuple(types.shape)} and input_ids differ")
            if "token_type_ids" not in self.input_names:
                if bool(types.any()):
                    raise SquantError("this package's model takes no token_type_ids (segments)")
            elif int(types.min()) < 0 or int(types.max()) >= self.type_vocab_size:
                raise SquantError(f"token_type_ids outside [0, {self.type_vocab_size})")
            else:
                inputs.append(types)
        if len(inputs) < len(self.input_names):
            inputs.append(torch.zeros_like(ids))
        return tuple(self.runner(*inputs))

    @property
    def squant_info(self) -> QuantizationRecord | None:
        d = self.manifest.get("quantization")
        return (
            None if d is None else QuantizationRecord.from_dict(d, "package manifest: quantization")
        )


class PackagedEncoder(nn.Module):
    """An exported package called like the Hugging Face model: keyword inputs, named outputs
    (`out.last_hidden_state`, `out.logits`), `config` when the deploy directory has one."""

    def __init__(self, exported: ExportedModel, config: Any = None) -> None:
        super().__init__()
        self.exported = exported
        self.config = config
        self.input_names = exported.input_names
        self.max_seq = int(exported.manifest["max_seq"])
        self.model_class = str(exported.manifest["model_class"])

    @property
    def squant_info(self) -> QuantizationRecord | None:
        return self.exported.squant_info

    def forward(self, **inputs: Tensor) -> NamedOutputs:
        out = self.exported(**inputs)
        return NamedOutputs(zip(self.exported.output_names, out, strict=True))


def padded_for_serving(package: PackagedEncoder, pad_token_id: int) -> Any:
    """The package as a server calls it (shapes.PaddedShapes): any batch as it is for a
    dynamic-batch package (beyond MAX_BATCH in chunks), else padded to its exported batch; any
    length for a dynamic-seq package, else padded to its one length."""
    from .shapes import PaddedShapes

    m = package.exported.manifest
    buckets = None if m["dynamic_seq"] else (m["seq"],)
    if m["dynamic_batch"]:
        return PaddedShapes(package, MAX_BATCH, buckets, pad_token_id, min_seq=2, pad_rows=False)
    return PaddedShapes(package, m["batch"], buckets, pad_token_id, min_seq=2)


def check_host(manifest: dict[str, Any]) -> None:
    """Refuse a package built for instructions this CPU lacks (it would crash with SIGILL)."""
    cpu = cpu_features()
    missing = [f for f in manifest.get("requires_isa", []) if not cpu.has(f)]
    if missing:
        raise SquantError(
            f"this package was built on a CPU with {', '.join(missing)}, which this CPU "
            f"({cpu.model_name}) lacks; export it again on this machine"
        )

"""AOTInductor packages: a quantized (or float) encoder as one .pt2 file plus a manifest.

    squant.export(qmodel, "deploy/", example_inputs=tok(["..."], return_tensors="pt"),
                  tokenizer=tok)

The directory holds model.pt2 (AOTInductor: compiled kernels + frozen weights, oneDNN-packed),
manifest.json (architecture, quantization, versions, the CPU ISA it was built for, input and
output names, shapes) and the tokenizer. Running it needs PyTorch only:

    runner = torch._inductor.aoti_load_package("deploy/model.pt2")
    outputs = runner(input_ids=ids, attention_mask=mask)   # a tuple of tensors

squant.load_exported() adds the manifest checks (ISA, versions) in front of that.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from . import __version__
from .attention import SQUANT_ATTENTION, FusedSelfAttention, register_squant_attention
from .compiler import CompileConfig, cast_float_parts
from .errors import SquantError
from .hardware import cpu_features
from .int8 import make_prepack_traceable
from .qlinear import QuantLinear

PACKAGE = "model.pt2"
MANIFEST = "manifest.json"
# ISA features a package may need from the host, from the most to the least demanding
REQUIRED_ISA = ("amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16", "avx512f", "avx2")


class _TupleOutputs(nn.Module):
    """Call by keyword and return a plain tuple of tensors (loadable without transformers)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        values = out.values() if isinstance(out, Mapping) else out
        return tuple(
            v.float() if v.is_floating_point() else v for v in values if isinstance(v, Tensor)
        )


def export(
    model: nn.Module,
    directory: str | Path,
    example_inputs: Mapping[str, Tensor],
    tokenizer: Any = None,
    config: CompileConfig | None = None,
    dynamic_seq: bool = False,
) -> Path:
    """Build an AOTInductor package for the shapes of example_inputs (input_ids and
    attention_mask, [batch, seq]); with dynamic_seq, for any sequence length up to the
    model's limit."""
    config = config or CompileConfig()
    if "input_ids" not in example_inputs or "attention_mask" not in example_inputs:
        raise SquantError("example_inputs needs input_ids and attention_mask")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    dtype = config.resolved_dtype()
    work = copy.deepcopy(model).eval()
    if dtype != torch.float32:
        cast_float_parts(work, dtype)
    if any(isinstance(m, FusedSelfAttention) for m in work.modules()):
        register_squant_attention()
        work.config._attn_implementation = SQUANT_ATTENTION
    make_prepack_traceable()
    for m in work.modules():  # the exported graph packs in-graph (see QuantLinear._packed)
        if isinstance(m, QuantLinear):
            del m._buffers["packed_weight"]
    wrapped = _TupleOutputs(work).eval()
    inputs = (example_inputs["input_ids"], example_inputs["attention_mask"])
    dynamic_shapes = None
    if dynamic_seq:
        seq = torch.export.Dim("seq", min=2, max=_max_positions(work))
        dynamic_shapes = ({1: seq}, {1: seq})
    with torch.no_grad():
        try:
            program = torch.export.export(
                wrapped, inputs, dynamic_shapes=dynamic_shapes, strict=False
            )
        except Exception as e:  # export failures are long traces; keep the first line
            raise SquantError(f"torch.export failed: {str(e).strip().splitlines()[0][:300]}") from e
        package = torch._inductor.aoti_compile_and_package(
            program,
            package_path=str(directory / PACKAGE),
            inductor_configs={"freezing": True},
        )
    cpu = cpu_features()
    manifest = {
        "format": "squant-aoti",
        "squant_version": __version__,
        "torch_version": torch.__version__,
        "model_class": type(model).__name__,
        "model_type": getattr(model.config, "model_type", None),
        "quantization": getattr(model, "squant_info", None),
        "float_dtype": str(dtype).replace("torch.", ""),
        "inputs": ["input_ids", "attention_mask"],
        "outputs": len(program.graph_signature.user_outputs),
        "batch": int(inputs[0].shape[0]),
        "seq": None if dynamic_seq else int(inputs[0].shape[1]),
        "dynamic_seq": dynamic_seq,
        "built_on": {"cpu": cpu.model_name, "isa": list(cpu.isa), "int8_path": cpu.int8_path},
        "requires_isa": [f for f in REQUIRED_ISA if cpu.has(f)],
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return Path(package)


def _max_positions(model: nn.Module) -> int:
    from .mappings import max_positions

    return max_positions(model)


def load_exported(directory: str | Path, num_runners: int = 1) -> Any:
    """The package's runner, after checking this host has the ISA it was built for.

    num_runners: how many calls may run at once (one per serving thread); the runners share
    one copy of the weights."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST
    if not (directory / PACKAGE).is_file() or not manifest_path.is_file():
        raise SquantError(f"{directory} is not a squant export ({PACKAGE} and {MANIFEST} needed)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise SquantError(f"{manifest_path} is corrupt ({e})") from None
    check_host(manifest)
    from torch._inductor.package import load_package

    return load_package(str(directory / PACKAGE), num_runners=num_runners)


def check_host(manifest: dict[str, Any]) -> None:
    """Refuse a package built for instructions this CPU lacks (it would crash with SIGILL)."""
    cpu = cpu_features()
    missing = [f for f in manifest.get("requires_isa", []) if not cpu.has(f)]
    if missing:
        raise SquantError(
            f"this package was built on a CPU with {', '.join(missing)}, which this CPU "
            f"({cpu.model_name}) lacks; export it again on this machine"
        )

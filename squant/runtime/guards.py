"""Which of dynamo's guards a compiled squant model keeps.

Before each call of a torch.compile'd module, dynamo checks every assumption its graph was
traced under: ~1,200 guards on real all-MiniLM-L6-v2 (each submodule's class, hooks and
attributes, the config, transformers' registries, squant's module constants), 0.5 ms a call,
about 5% of a 1 x 128 forward (AVX512-VNNI Zen 5, 2 threads). A model squant.compile holds is
its own copy, compiled with freezing (its weights are already constants of the graph; editing
them afterwards changes nothing), so guards on the model, on the code's closures and on module
globals can only ever pass, but one: which model this is. Every model of one class shares its
forward's code, and dynamo keeps the compiled graphs of all of them on that code; without a
guard on the model's identity a graph with one model's frozen weights would answer calls of
another. One identity check on a weight of the model (unique to it: squant.compile compiles a
copy) stays. Also guarded, as all that can change from call to call: the call's arguments
(tensor shapes, dtypes and strides, which keywords are passed, their values) and global state
(grad mode, autocast, torch function modes, default device, dynamic-shape constraints). A new
input shape still recompiles, or runs eagerly once the model is sealed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor
from torch._dynamo.source import GlobalSource, GlobalWeakRefSource, LocalSource

# the local that holds the module in the frame dynamo compiles (its forward's `self`)
MODEL_LOCAL = "self"


def _root(source: Any) -> Any:
    """The source a guarded value is reached from (a local or a global), or None."""
    while source is not None and not isinstance(
        source, (LocalSource, GlobalSource, GlobalWeakRefSource)
    ):
        source = getattr(source, "base", None)
    return source


def guards_on_frozen_model(source: Any) -> bool:
    """True when a guard on a value reached from `source` checks the frozen model or code:
    the module itself, a closure variable of the compiled code, or a module global."""
    root = _root(source)
    if isinstance(root, (GlobalSource, GlobalWeakRefSource)):
        return True
    if isinstance(root, LocalSource):
        if root.is_derefed_cell_contents and not root.is_input:
            return True
        return root.local_name == MODEL_LOCAL
    return False  # global state (grad mode, ...) or a source of a kind not known here: kept


def _source(entry: Any) -> Any:
    guard = entry.orig_guard
    return None if guard is None else guard.originating_source


def _is_weight_identity(entry: Any) -> bool:
    """An identity check of a tensor held by the model (one of its weights or buffers)."""
    if entry.guard_type != "ID_MATCH" or not entry.has_value:
        return False
    root = _root(_source(entry))
    on_model = isinstance(root, LocalSource) and root.local_name == MODEL_LOCAL
    return on_model and isinstance(entry.value, Tensor)


def keep_call_guards(entries: Sequence[Any]) -> list[bool]:
    """torch.compile's `guard_filter_fn`: keep the guards on the call and on global state and
    one identity check of the model; all guards where the model cannot be identified."""
    identity = next((i for i, e in enumerate(entries) if _is_weight_identity(e)), None)
    if identity is None:
        return [True] * len(entries)
    keep = []
    for i, entry in enumerate(entries):
        source = _source(entry)
        keep.append(i == identity or source is None or not guards_on_frozen_model(source))
    return keep

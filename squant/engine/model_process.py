"""The model in a process of its own, so the server's Python never shares its GIL.

    remote = ModelProcess(path, config)          # starts, loads, compiles; waits until ready
    rows = remote(ids, mask, types)              # a padded batch -> pooled rows [batch, dim]

Why: the compiled model's forward releases the GIL, but takes it back for moments inside the
call (the C++ wrapper frees tensors that have Python objects: inputs, inductor's constants).
Each time, it waits for whichever thread holds it: in one process, the HTTP front end, JSON
and tokenization. Beside a Python thread holding the GIL ~30% of the time on another core the
model ran at 0.89x its speed (docs/serving.md, served vs bench). Here the front end (uvicorn, the
Engine's queue and batching) stays in the server process; a child process holds the one copy
of the model, and one thread per instance, each pinned to its cores with its own OpenMP
team, as the Engine's workers are in-process. A batch crosses a pipe as three small int64
arrays, and comes back as its pooled rows: tens of KB, microseconds against a batch's
milliseconds.

The child is started with "spawn" (a fork of a process that has run OpenMP work can hang),
loads the directory itself, and compiles (or not) as the config's runtime says. It dies with
the server: it is a daemon, and it exits when its pipes close.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import queue
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import SquantError, first_line
from ..runtime.placement import pin_current_thread, plan

# loading and compiling a model takes seconds to minutes; a child silent for this long is hung
START_TIMEOUT_S = 1800.0


class ModelProcessError(RuntimeError):
    """The model process died or failed a batch (the batch's requests fail, HTTP 500)."""


def _child_main(path: str, config: Any, pooling_from: str | None, conns: list[Connection]) -> None:
    """Load the engine's model here and answer batches, one thread per instance (pipe)."""
    import signal

    from .local_engine import local_engine

    # Ctrl-C reaches the whole process group: the server drains and then closes the pipes,
    # which ends this process; dying at once here would fail the batches being drained
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        placement = plan(config.instances, config.cores_per_instance)
        # loading and compiling run on the model's cores
        pin_current_thread(sorted({c for group in placement.cores for c in group}))
        if config.malloc_arenas:  # as Engine.start does in one process
            from .process_memory import limit_malloc_arenas

            limit_malloc_arenas(config.malloc_arenas)
        engine = local_engine(path, dataclasses.replace(config, model_process=False), pooling_from)
    except BaseException as e:  # told to the parent, which raises it as a SquantError
        conns[0].send(("error", f"{type(e).__name__}: {first_line(e)}"[:500]))
        return
    conns[0].send(("ready", describe(engine.model)))
    threads = [
        threading.Thread(target=_answer, args=(engine, i, conn), daemon=True)
        for i, conn in enumerate(conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def describe(model: Any) -> dict[str, Any]:
    """What the server process needs to know of the child's model (ModelDescription)."""
    from ..quant.mappings import input_names, max_positions
    from ..quant.record import record_of

    return {
        "model_class": str(getattr(model, "model_class", type(model).__name__)),
        "config": getattr(model, "config", None),
        "input_names": tuple(input_names(model)),
        "max_seq": max_positions(model),
        "squant_info": record_of(model),
    }


class ModelDescription(nn.Module):
    """The server process's stand-in for a model that runs in the child: no weights, only what
    the Engine and the routes read (its class for the task, its Hugging Face config for
    labels and /info, its inputs, its positions, squant's quantization record)."""

    def __init__(
        self,
        model_class: str,
        config: Any,
        input_names: tuple[str, ...],
        max_seq: int,
        squant_info: Any,
    ) -> None:
        super().__init__()
        self.model_class, self.config, self.input_names = model_class, config, input_names
        self.max_seq, self.squant_info = max_seq, squant_info


def _answer(engine: Any, index: int, conn: Connection) -> None:
    """Run the batches that arrive on `conn`. The heap is trimmed here as the Engine's workers
    trim theirs (the activations live in this process): after idle_trim_s without a batch,
    and when no batch is waiting, at most every trim_interval_s."""
    from .process_memory import release_free_memory

    pin_current_thread(engine.placement.cores[index], engine.placement.cores_per_instance)
    idle_s, every_s = engine.config.idle_trim_s, engine.config.trim_interval_s
    ran, last_trim = False, time.monotonic()
    while True:
        try:
            waiting = conn.poll(0)
            due = every_s and time.monotonic() - last_trim >= every_s
            if ran and not waiting and (due or (idle_s and not conn.poll(idle_s))):
                release_free_memory()
                ran, last_trim = False, time.monotonic()
            message = conn.recv()
        except (EOFError, OSError):  # the server closed its end, or died
            return
        if message is None:
            return
        if message == "seal":
            engine.seal()
            conn.send(("sealed", None))
            continue
        try:
            rows = engine.executor(*message)
            conn.send(("rows", (rows.numpy(), engine.refused_recompiles)))
        except Exception as e:  # one bad batch fails its requests, not the process
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
        ran = True


class ModelProcess:
    """A child process holding the model (see the module docstring). Callable from any number
    of threads at once: each call takes a free instance's pipe, so at most `instances` batches
    run at a time, each on its own cores. The engine's executor (engine.executor) when the
    model lives in a child."""

    in_process = False  # the engine's workers only wait on its pipes

    def __init__(
        self, path: str | Path, config: Any, pooling_from: str | Path | None = None
    ) -> None:
        ctx = multiprocessing.get_context("spawn")
        instances = plan(config.instances, config.cores_per_instance).instances
        pairs = [ctx.Pipe() for _ in range(instances)]
        self._free: queue.Queue[Connection] = queue.Queue()
        self.process = ctx.Process(
            target=_child_main,
            args=(
                str(path),
                config,
                None if pooling_from is None else str(pooling_from),
                [child for _, child in pairs],
            ),
            daemon=True,
            name="squant-model",
        )
        self.process.start()
        for _, child in pairs:
            child.close()  # the child holds these now: EOF reaches us when it dies
        first = pairs[0][0]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not first.poll(0.2):
            if not self.process.is_alive():
                raise SquantError(
                    f"the model process exited while loading (exit code {self.process.exitcode})"
                )
            if time.monotonic() > deadline:
                self.process.kill()
                raise SquantError(f"the model process was not ready in {START_TIMEOUT_S:.0f} s")
        try:
            kind, detail = first.recv()
        except (EOFError, OSError):  # it died before a word (e.g. spawn re-ran an unguarded main)
            self.process.join(5.0)
            raise SquantError(
                f"the model process exited while loading (exit code {self.process.exitcode}); "
                "a script that starts one needs an `if __name__ == '__main__':` guard"
            ) from None
        if kind != "ready":
            self.process.join(5.0)
            raise SquantError(f"the model process could not load {path}: {detail}")
        self.description = ModelDescription(**detail)
        self.refused_recompiles = 0  # as the child last reported it
        for parent, _ in pairs:
            self._free.put(parent)
        self._conns = [parent for parent, _ in pairs]

    def __call__(
        self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray, per_token: bool = False
    ) -> torch.Tensor:
        """The pooled rows (embeddings or logits) of one padded batch; with per_token, its
        last hidden state."""
        conn = self._free.get()
        try:
            conn.send((ids, mask, types, per_token))
            kind, payload = conn.recv()
        except (EOFError, OSError) as e:  # BrokenPipeError is an OSError
            code = self.process.exitcode
            raise ModelProcessError(f"the model process died (exit code {code}): {e}") from None
        finally:
            self._free.put(conn)
        if kind != "rows":
            raise ModelProcessError(f"the model process failed the batch: {payload}")
        rows, refused = payload
        self.refused_recompiles = max(self.refused_recompiles, int(refused))
        return torch.from_numpy(rows)

    def seal(self) -> None:
        """No compiling in the child from now on (Engine.seal there)."""
        conn = self._free.get()
        try:
            conn.send("seal")
            kind, _ = conn.recv()
        except (EOFError, OSError) as e:
            raise ModelProcessError(
                f"the model process died (exit code {self.process.exitcode}): {e}"
            ) from None
        finally:
            self._free.put(conn)
        if kind != "sealed":
            raise ModelProcessError(f"the model process could not seal its model: {kind}")

    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self, timeout_s: float = 5.0) -> None:
        """Ask every instance thread to stop, then end the process."""
        for conn in self._conns:
            with contextlib.suppress(OSError):  # the child is gone already
                conn.send(None)
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout_s)

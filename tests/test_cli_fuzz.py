"""The command line under generated arguments (hypothesis).

Every invocation of every subcommand, with any of its flags and hostile values (nan, inf,
huge numbers, empty strings, undecodable bytes) and hostile paths (missing, a file where a
directory belongs, corrupt JSON, non-UTF-8 text, an empty directory), must end with exit 0, or
with exit 2 and one line on stderr: never a traceback, and never a write anywhere but the
output path it was given. The flags come from the parser itself, so a new flag is fuzzed as
soon as it exists.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

from squant import cli  # noqa: E402

EXAMPLES = 500
# values a shell can pass: no NUL, but undecodable bytes arrive as surrogate escapes
VALUES = [
    "", "0", "1", "-1", "2", "0.5", "nan", "inf", "-inf", "1e9", "1e309", "99999999999999999999",
    "auto", "none", "static", "x", "..", "/", "/dev/null", "é", "\udcff", "--", "-",
]  # fmt: skip


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "text.txt").write_text("a cat\na dog\n")
    (root / "binary.bin").write_bytes(b"\xff\xfe\x00\x81" * 64)
    (root / "empty_dir").mkdir()
    corrupt = root / "corrupt_ckpt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    array = root / "array_ckpt"
    array.mkdir()
    (array / "config.json").write_text("[1, 2, 3]")
    (array / "squant.json").write_text('{"format": 99}')
    (root / "rows.jsonl").write_text('{"text": "a"}\n[1]\n"bare"\n{"text": 5}\n')
    return root


def _paths(root: Path) -> list[str]:
    names = ["text.txt", "binary.bin", "empty_dir", "corrupt_ckpt", "array_ckpt", "rows.jsonl"]
    return [str(root / n) for n in names] + [str(root / "missing"), str(root / "out")]


def _commands() -> dict[str, tuple[list[argparse.Action], list[argparse.Action]]]:
    """Per subcommand: its positionals and its options (help excluded)."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        actions = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
        out[name] = (
            [a for a in actions if not a.option_strings],
            [a for a in actions if a.option_strings],
        )
    return out


COMMANDS = _commands()


@st.composite
def invocations(draw, root: Path) -> list[str]:
    paths = _paths(root)
    value = st.sampled_from(VALUES + paths)
    name = draw(st.sampled_from(sorted(COMMANDS)))
    positionals, options = COMMANDS[name]
    argv = [name]
    for _ in positionals:
        argv.append(draw(st.sampled_from(paths)) if draw(st.booleans()) else draw(value))
    for action in draw(st.lists(st.sampled_from(options), max_size=5, unique_by=id)):
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
        elif action.choices and draw(st.booleans()):
            argv += [flag, str(draw(st.sampled_from(list(action.choices))))]
        else:
            argv += [flag, draw(value)]
    return argv


def _run_cleanly(argv: list[str]) -> int:
    """Run the CLI; it must end with 0, or with 2 and an error line: never a traceback."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    message = err.getvalue()
    assert "Traceback" not in message, (argv, message)
    if code != 0:
        assert code == 2, (argv, code, message)
        lines = [line for line in message.splitlines() if line.strip()]
        assert lines and "error" in lines[-1], (argv, message)
    return code


def test_no_invocation_ends_in_a_traceback_or_writes_outside_its_output(inputs, monkeypatch):
    monkeypatch.chdir(inputs)  # a relative path lands here, where the snapshot sees it
    # never reach a model hub, never open a port anyone could need
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = _tree(inputs)
    ran: list[int] = []

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(invocations(inputs))
    def one(argv: list[str]) -> None:
        ran.append(_run_cleanly(argv))
        after = {k: v for k, v in _tree(inputs).items() if not k.startswith("out")}
        assert after == before, (argv, set(after) ^ set(before))

    one()
    assert len(ran) >= EXAMPLES


# Generated invocations on a model that loads: the commands whose work is seconds on a tiny
# model, each with what keeps it eager and short appended (argparse keeps the last value), so
# the fuzz reaches loading, calibration, quantization, evaluation and writing outputs.
MODEL_EXAMPLES = 40
# per command: what it needs (first, so a generated flag can replace it), and what keeps it
# eager and short (last: argparse keeps the last value)
REAL_COMMANDS = {
    "quantize": (["--calib", "{calib}", "--out", "{out}"], []),
    "bench": ([], ["--variants", "fp32,static", "--duration", "0.1"]),
    "eval": (
        ["--task", "snli", "--data", "{labeled}", "--calib-size", "4"],
        ["--variants", "fp32,static", "--limit", "8"],
    ),
    "analyze": ([], ["--hotspots", "", "--quick"]),
    "embed": (["--out", "{out}"], ["--runtime", "eager", "--instances", "1"]),
}


def model_invocations(
    seed: int, count: int, root: Path, models: dict[str, str], data: list[str]
) -> list[list[str]]:
    """`count` invocations drawn from a seeded generator: the same ones on every run (so the
    share that must succeed can be asserted), with values mostly a user's (of the flag's
    type) and sometimes hostile; hypothesis would shrink towards the first, mostly refused,
    choices. models: "classifier" and "base"."""
    import random

    rng = random.Random(seed)
    paths = [*models.values(), *data, str(root / "missing"), str(root / "out")]
    names = {"calib": data[0], "labeled": data[-1], "out": str(root / "out"), "text": data[1]}
    out = []
    for _ in range(count):
        name = rng.choice(sorted(REAL_COMMANDS))
        positionals, options = COMMANDS[name]
        needs, keeps_short = REAL_COMMANDS[name]
        kind = "base" if name == "embed" else "classifier"
        if rng.random() < 0.1:
            kind = "base" if kind == "classifier" else "classifier"
        argv = [name, models[kind], *(names["text"] for _ in positionals[1:])]
        argv += [arg.format(**names) for arg in needs]
        for action in rng.sample(options, k=rng.randint(0, 3)):
            flag = rng.choice(action.option_strings)
            typed = getattr(action.type, "__name__", "")
            if action.nargs == 0:
                argv.append(flag)
            elif action.choices and rng.random() < 0.5:
                argv += [flag, str(rng.choice(list(action.choices)))]
            elif rng.random() < 0.8:  # a value a user would pass, so work runs
                user = ["1", "2"] if "int" in typed else ["0.5", "1"] if "float" in typed else data
                argv += [flag, rng.choice(user)]
            else:
                argv += [flag, rng.choice(VALUES + paths)]
        out.append(argv + keeps_short)
    return out


def kept(root: Path, tree: dict[str, bytes], given: list[Path]) -> dict[str, bytes]:
    """tree without what lies at or under a path the invocation was given."""

    def named(path: Path) -> bool:
        return any(path == g or g in path.parents for g in given)

    return {k: v for k, v in tree.items() if not named((root / k).resolve())}


def test_invocations_on_a_loadable_model_end_cleanly(
    inputs, tiny_checkpoint, base_dir, calib_jsonl, tmp_path, monkeypatch
):
    import shutil

    monkeypatch.chdir(inputs)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # private copies: an invocation may legitimately write its --out/--json over any path it
    # is given, and the session's shared fixtures must stay as other tests expect them
    tiny_checkpoint = Path(shutil.copytree(tiny_checkpoint, tmp_path / "classifier"))
    base_dir = Path(shutil.copytree(base_dir, tmp_path / "base"))
    calib_jsonl = Path(shutil.copy(calib_jsonl, tmp_path / "calib.jsonl"))
    models = {"classifier": str(tiny_checkpoint), "base": str(base_dir)}
    labeled = inputs / "labeled.jsonl"
    labeled.write_text(
        '{"sentence1": "a cat sat", "sentence2": "a cat", "label": 0}\n'
        '{"sentence1": "a dog ran", "sentence2": "a cat", "label": 2}\n' * 80
    )
    data = [str(calib_jsonl), str(inputs / "text.txt"), str(inputs / "rows.jsonl"), str(labeled)]
    watched = [inputs, tmp_path]
    codes = []
    for argv in model_invocations(0, MODEL_EXAMPLES, inputs, models, data):
        before = [_tree(root) for root in watched]
        codes.append(_run_cleanly(argv))
        # outputs it was given (--out, --json, --png) may appear; nothing else may change
        given = [
            Path(v).resolve()
            for f, v in itertools.pairwise(argv)
            if f in ("--out", "--json", "--png")
        ]
        after = [kept(root, _tree(root), given) for root in watched]
        before = [kept(root, b, given) for root, b in zip(watched, before, strict=True)]
        assert after == before, argv
    assert codes.count(0) >= MODEL_EXAMPLES // 4, codes  # it reached real work, not only errors

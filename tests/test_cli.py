"""The `squant` command end to end on a tiny checkpoint saved to disk."""

import pytest
import torch

import squant
from squant.checkpoint.models import load_model, load_tokenizer
from squant.cli import main
from squant.errors import SquantError


def test_quantize_command_writes_a_loadable_model(tiny_checkpoint, calib_jsonl, tmp_path, capsys):
    out = tmp_path / "int8"
    code = main(
        [
            "quantize",
            str(tiny_checkpoint),
            "--mode",
            "dynamic",
            "--alpha",
            "0.6",
            "--calib",
            str(calib_jsonl),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "quantized 8 linears of BertForSequenceClassification" in capsys.readouterr().out
    q = squant.load(out)
    assert q.squant_info.config.alpha == 0.6
    tok = load_tokenizer(out)  # the tokenizer travels with the model
    enc = tok(["the cat sat"], ["a dog runs"], return_tensors="pt")
    ref = load_model(tiny_checkpoint)
    with torch.no_grad():
        a, b = q(**enc).logits, ref(**enc).logits
    assert float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), 0)) > 0.99


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/dir"], "does not exist"),
        (["{ckpt}", "--alpha", "2"], "alpha must be in"),
        (["{ckpt}", "--max-length", "999"], "exceeds the model's 64 positions"),
        (["{ckpt}", "--calib", "/no/file.txt"], "calibration file /no/file.txt does not exist"),
        (["{ckpt}", "--calib-size", "0"], "calib-size"),
        (["{tmp}"], "no config.json"),
    ],
)
def test_quantize_command_errors_are_one_line(
    tiny_checkpoint, calib_jsonl, tmp_path, capsys, args, message
):
    args = [a.format(ckpt=tiny_checkpoint, tmp=tmp_path) for a in args]
    if "--calib" not in args:
        args += ["--calib", str(calib_jsonl)]
    code = main(["quantize", *args, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("squant quantize: error:")
    assert message in err
    assert "\n" not in err
    assert not (tmp_path / "o").exists()


def test_corrupt_checkpoint_weights(tiny_checkpoint, calib_jsonl, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_checkpoint.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"garbage")
    code = main(
        ["quantize", str(broken), "--calib", str(calib_jsonl), "--out", str(tmp_path / "o")]
    )
    assert code == 2
    assert "cannot load weights" in capsys.readouterr().err


def _one_line_error(capsys, code, command, message):
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith(f"squant {command}: error:"), err
    assert message in err, err
    assert "\n" not in err, err


def test_quantize_never_overwrites_its_source(tiny_checkpoint, calib_jsonl, capsys):
    before = {p.name: p.read_bytes() for p in tiny_checkpoint.iterdir()}
    for out in (tiny_checkpoint, tiny_checkpoint.parent):
        code = main(
            [
                "quantize",
                str(tiny_checkpoint),
                "--calib",
                str(calib_jsonl),
                "--out",
                str(out),
                "--overwrite",
            ]
        )
        _one_line_error(capsys, code, "quantize", "overlaps the input")
    assert {p.name: p.read_bytes() for p in tiny_checkpoint.iterdir()} == before


def test_quantize_into_a_foreign_directory_needs_overwrite(
    tiny_checkpoint, calib_jsonl, tmp_path, capsys
):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    args = ["quantize", str(tiny_checkpoint), "--calib", str(calib_jsonl), "--out", str(out)]
    _one_line_error(capsys, main(args), "quantize", "not written by squant")
    assert (out / "notes.txt").read_text() == "keep me"
    assert main([*args, "--overwrite"]) == 0
    assert (out / "squant.json").is_file() and not (out / "notes.txt").exists()
    assert main(args) == 0  # a directory squant wrote may be replaced without --overwrite


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-length", "0"], "expected an integer >= 1, got 0"),
        (["--batch-size", "-1"], "expected an integer >= 1"),
        (["--exclude", "*"], "nothing left to quantize"),
        (["--out", "{file}/sub"], "is a file, not a directory"),
        (["--out", "{file}"], "exists and is not a directory"),
    ],
)
def test_quantize_bad_options_fail_before_any_work(
    tiny_checkpoint, calib_jsonl, tmp_path, capsys, extra, message
):
    file = tmp_path / "a-file"
    file.write_text("x")
    extra = [e.format(file=file) for e in extra]
    out = ["--out", str(tmp_path / "o")] if "--out" not in extra else []
    code = main(["quantize", str(tiny_checkpoint), "--calib", str(calib_jsonl), *out, *extra])
    _one_line_error(capsys, code, "quantize", message)
    assert not (tmp_path / "o").exists()
    assert file.read_text() == "x"


def test_quantize_without_tokenizer_files_says_so(tiny_checkpoint, calib_jsonl, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((tiny_checkpoint / name).read_bytes())
    code = main(["quantize", str(bare), "--calib", str(calib_jsonl), "--out", str(tmp_path / "o")])
    _one_line_error(capsys, code, "quantize", "has no tokenizer files")


def test_calibration_mixing_texts_and_pairs_is_refused(tiny_checkpoint, tmp_path, capsys):
    calib = tmp_path / "mixed.jsonl"
    calib.write_text('{"text": "the cat sat"}\n{"premise": "a dog", "hypothesis": "a cat"}\n')
    out = str(tmp_path / "o")
    code = main(["quantize", str(tiny_checkpoint), "--calib", str(calib), "--out", out])
    _one_line_error(capsys, code, "quantize", "mix single sentences and pairs (text 2")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "0"], "--duration: expected a finite number > 0"),
        (["--duration", "-5"], "--duration"),
        (["--duration", "nan"], "--duration"),
        (["--batch", "0"], "--batch: expected an integer >= 1, got 0"),
        (["--seq", "0"], "--seq"),
        (["--instances", "0"], "--instances"),
        (["--cores-per-instance", "0"], "--cores-per-instance"),
        (["--seq", "100000"], "exceeds the model's 512 positions"),
    ],
)
def test_bench_bad_numbers_are_one_line(capsys, args, message):
    code = main(["bench", "distilbert-base-uncased", "--variants", "fp32", *args])
    _one_line_error(capsys, code, "bench", message)


def _squad(tmp_path, qas, name="squad.json"):
    import json

    data = {"data": [{"paragraphs": [{"context": "the cat sat on the mat .", "qas": qas}]}]}
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_eval_refuses_data_it_would_score_wrongly(tiny_checkpoint, tmp_path, capsys):
    qa = {"question": "where did the cat sit", "answers": [{"text": "the mat"}]}
    dup = _squad(tmp_path, [{**qa, "id": "q1"}, {**qa, "id": "q1"}] * 100)
    code = main(["eval", str(tiny_checkpoint), "--task", "squad", "--data", str(dup)])
    _one_line_error(capsys, code, "eval", "question id 'q1' appears twice")
    # the tiny checkpoint is a classifier: it has no trained QA head to score SQuAD with
    ok = _squad(tmp_path, [{**qa, "id": f"q{i}"} for i in range(200)], "ok.json")
    code = main(["eval", str(tiny_checkpoint), "--task", "squad", "--data", str(ok)])
    _one_line_error(capsys, code, "eval", "no trained weights for BertForQuestionAnswering")
    rows = ['{"sentence1": "a cat", "sentence2": "a dog", "gold_label": "0"}'] * 200
    rows.insert(3, '{"sentence1": "a cat", "gold_label": "1"}')
    mnli = tmp_path / "mnli.jsonl"
    mnli.write_text("\n".join(rows) + "\n")
    code = main(["eval", str(tiny_checkpoint), "--task", "mnli", "--data", str(mnli)])
    _one_line_error(capsys, code, "eval", "mnli.jsonl:4: expected a sentence pair")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("list.jsonl", b'["sentence1", "sentence2"]\n', "expected a JSON object, got list"),
        ("deep.jsonl", b"[" * 50_000 + b"]" * 50_000 + b"\n", "nested too deeply"),
        ("binary.tsv", b"sentence\tlabel\n\xff\xfe\x00\x81\tx\n", "not UTF-8"),
        ("deep.json", b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
    ],
)
def test_eval_malformed_data_is_one_line(tiny_checkpoint, tmp_path, capsys, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    task = "squad" if name.endswith(".json") else "glue"
    code = main(["eval", str(tiny_checkpoint), "--task", task, "--data", str(path)])
    _one_line_error(capsys, code, "eval", message)


def test_export_command_builds_a_deploy_directory(deploy_dir):
    import json

    quantized, deploy = deploy_dir  # `squant export int8/ --batch 2 --dynamic-seq`
    manifest = json.loads((deploy / "manifest.json").read_text())
    assert (manifest["batch"], manifest["dynamic_seq"]) == (2, True)
    packaged = squant.load_packaged(deploy)
    tok = load_tokenizer(deploy)  # the tokenizer travels with the package
    enc = tok(
        ["the cat sat", "a dog"],
        ["a man", "the red car runs fast"],
        return_tensors="pt",
        padding=True,
    )
    with torch.no_grad():
        ref = squant.load(quantized)(**enc).logits
    got = packaged(**enc).logits
    assert float(torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), 0)) > 0.999


def test_export_command_errors_are_one_line(tiny_checkpoint, tmp_path, capsys):
    code = main(["export", str(tiny_checkpoint), "--out", str(tmp_path / "d")])
    _one_line_error(capsys, code, "export", "is a float checkpoint: pass --calib")
    code = main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "d")])
    _one_line_error(capsys, code, "export", "does not exist")
    code = main(["export", str(tiny_checkpoint), "--out", str(tmp_path / "d"), "--seq", "1"])
    _one_line_error(capsys, code, "export", "seq >= 2")
    assert not (tmp_path / "d").exists()


def test_quantize_report_compares_held_out_texts_with_fp32(tiny_checkpoint, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(f"the cat sat on the mat {i}" for i in range(40)))
    out = tmp_path / "q"
    code = main(
        [
            "quantize",
            str(tiny_checkpoint),
            "--calib",
            str(texts),
            "--calib-size",
            "30",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    import re

    found = re.search(r"vs FP32 on 10 held-out texts: cosine mean ([\d.]+), min ([\d.]+)", printed)
    assert found, printed
    assert 0.95 < float(found[2]) <= float(found[1]) <= 1.0
    assert "size on disk: before" in printed


def _labelled(tmp_path, n=48):
    """Sentence pairs with integer labels the tiny classifier can be scored on."""
    import json

    words = [
        "the",
        "cat",
        "sat",
        "on",
        "mat",
        "a",
        "dog",
        "runs",
        "fast",
        "red",
        "car",
        "man",
        "plays",
        "music",
    ]
    rows = [
        {
            "sentence1": " ".join(words[i % 7 : i % 7 + 4]),
            "sentence2": " ".join(words[(i * 3) % 9 : (i * 3) % 9 + 3]),
            "label": str(i % 2),
        }
        for i in range(n)
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_tune_command_saves_the_chosen_model_and_its_report(
    tiny_checkpoint, calib_jsonl, tmp_path, capsys
):
    import json

    out = tmp_path / "tuned"
    data = _labelled(tmp_path)
    args = ["tune", str(tiny_checkpoint), "--task", "glue", "--data", str(data)]
    code = main([*args, "--calib", str(calib_jsonl), "--max-loss", "50%", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((out / "tune.json").read_text())
    assert report["within_budget"] is True
    assert report["budget_percent"] == 50.0
    assert report["chosen"] == report["tried"][-1]["config"]
    assert report["chosen"]["mode"] == "static"  # the faster candidate is tried first
    assert "chosen: static" in printed and "saved ->" in printed
    tuned = squant.load(out)
    assert tuned.squant_info.config.mode == "static"
    # bad arguments: one line, nothing written
    bad = tmp_path / "bad"
    code = main([*args, "--calib", str(calib_jsonl), "--metric", "f9", "--out", str(bad)])
    _one_line_error(capsys, code, "tune", "metric 'f9' is not one of this task's")
    assert not (bad / "squant.json").exists()


def test_analyze_command_prints_roofline_and_writes_json(tiny_checkpoint, tmp_path, capsys):
    import json

    record = tmp_path / "analyze.json"
    args = ["analyze", str(tiny_checkpoint), "--seq", "16", "--threads", "1", "--quick"]
    code = main([*args, "--hotspots", "", "--png", "", "--json", str(record)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "roofline-bound ms per forward" in printed
    saved = json.loads(record.read_text())
    assert saved["batch"] == 1 and saved["seq"] == 16
    assert saved["peaks"]["bandwidth_bytes_per_s"] > 0
    code = main(["analyze", str(tmp_path / "missing"), "--hotspots", "", "--png", ""])
    _one_line_error(capsys, code, "analyze", "missing")


@pytest.mark.parametrize("flag", ["--json", "--png"])
def test_output_files_inside_an_input_or_on_a_directory_are_refused_before_work(
    tiny_checkpoint, tmp_path, capsys, flag
):
    before = (tiny_checkpoint / "config.json").read_bytes()
    cases = [
        (str(tiny_checkpoint / "config.json"), "inside the input"),
        (str(tmp_path), "is a directory"),
    ]
    commands = [["bench", str(tiny_checkpoint), "--variants", "fp32"]]
    if flag == "--json":
        data = tmp_path / "mnli.jsonl"
        data.write_text('{"premise": "a", "hypothesis": "b", "label": 0}\n')
        commands.append(["eval", str(tiny_checkpoint), "--task", "mnli", "--data", str(data)])
    for command in commands:
        for target, message in cases:
            code = main([*command, flag, target])
            _one_line_error(capsys, code, command[0], message)
    assert (tiny_checkpoint / "config.json").read_bytes() == before


def test_a_json_calibration_file_is_refused_not_read_as_text_lines(
    tiny_checkpoint, tmp_path, capsys
):
    calib = tmp_path / "calib.json"
    calib.write_text('[{"text": "a cat"}, {"text": "a dog"}]')
    code = main(
        ["quantize", str(tiny_checkpoint), "--calib", str(calib), "--out", str(tmp_path / "o")]
    )
    _one_line_error(capsys, code, "quantize", ".json is not a calibration format")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # a JSON number beyond Python's integer-digit limit, in any JSON/JSONL input
        (["quantize", "{ckpt}", "--calib", "{big}", "--out", "{tmp}/o"], "number too long"),
        (["analyze", "{ckpt}", "--seq", "1000000", "--png", ""], "exceeds the model's"),
        (["bench", "{ckpt}", "--seq", "1000000"], "exceeds the model's"),
        (["bench", "{ckpt}", "--batch", "1000000000"], "tokens; at most"),
        (["analyze", "{ckpt}", "--threads", "100000", "--png", ""], "CPUs this process"),
        (
            ["analyze", "{ckpt}", "--quick", "--hotspots", "", "--png", "", "--bench", "{binary}"],
            "UTF-8",
        ),
        (
            ["analyze", "{ckpt}", "--quick", "--hotspots", "", "--png", "", "--bench", "{array}"],
            "bench JSON",
        ),
        (["serve", "{ckpt}", "--port", "70000"], "1..65535"),
    ],
)
def test_inputs_that_once_raised_tracebacks_are_one_line_errors(
    tiny_checkpoint, tmp_path, capsys, argv, message
):
    big = tmp_path / "big.jsonl"
    big.write_text('{"text": ' + "9" * 5000 + "}\n")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe{")
    (tmp_path / "array.json").write_text("[1, 2]")
    paths = {
        "ckpt": str(tiny_checkpoint),
        "big": str(big),
        "tmp": str(tmp_path),
        "binary": str(tmp_path / "binary.json"),
        "array": str(tmp_path / "array.json"),
    }
    code = main([a.format(**paths) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err and message in err[-1]


def test_analyze_defaults_fit_a_model_with_few_positions(tiny_checkpoint, capsys, tmp_path):
    """The default --seq (256) is cut to the model's positions instead of failing."""
    from squant.checkpoint.models import load_model
    from squant.quant.mappings import max_positions

    assert max_positions(load_model(tiny_checkpoint, task="base")) < 256
    record = tmp_path / "a.json"
    code = main(
        ["analyze", str(tiny_checkpoint), "--hotspots", "", "--png", "", "--json", str(record)]
    )
    assert code == 0, capsys.readouterr().err


def test_export_flags_are_exportconfigs_fields_with_their_defaults_and_help():
    """squant export's shape flags come from ExportConfig itself: a new field is a new flag,
    a changed default changes the CLI's, and each has the field's help."""
    import dataclasses

    from squant.cli import build_parser
    from squant.commands.common import dataclass_from_args
    from squant.runtime.export import ExportConfig

    parser = build_parser()
    args = parser.parse_args(["export", "src", "--out", "o"])
    assert dataclass_from_args(ExportConfig, args) == ExportConfig()
    given = ["--batch", "4", "--seq", "64", "--dynamic-seq", "--dynamic-batch"]
    args = parser.parse_args(["export", "src", "--out", "o", *given, "--float-dtype", "fp32"])
    assert dataclass_from_args(ExportConfig, args) == ExportConfig(4, 64, True, True, "fp32")
    for f in dataclasses.fields(ExportConfig):
        assert f.metadata.get("help"), f.name
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "src", "--out", "o", "--batch", "0"])


def test_serve_flags_are_serveconfigs_fields_with_their_defaults():
    """squant serve's engine flags come from ServeConfig (defaults, help, --timeout for
    timeout_s): with none given the engine gets ServeConfig's own settings."""
    import dataclasses

    from squant.cli import build_parser
    from squant.commands.serve import SERVE_FLAGS, serve_config
    from squant.engine.engine import ServeConfig

    parser = build_parser()
    args = parser.parse_args(["serve", "model", "--model-process", "off"])
    assert serve_config(args) == ServeConfig()
    given = ["--timeout", "5", "--max-queue", "7", "--watch-ranges", "--instances", "1"]
    args = parser.parse_args(["serve", "model", "--model-process", "off", *given])
    want = ServeConfig(timeout_s=5.0, max_queue=7, watch_ranges=True, instances=1)
    assert serve_config(args) == want
    fields = {f.name: f for f in dataclasses.fields(ServeConfig)}
    assert all(fields[name].metadata.get("help") for name in SERVE_FLAGS)


def test_embed_flags_are_serveconfigs_fields_with_bulk_embeddings_batch_default():
    from squant.cli import build_parser
    from squant.commands.common import dataclass_values
    from squant.commands.embed import EMBED_FLAGS
    from squant.engine.engine import OFFLINE_BATCH_TOKENS, ServeConfig

    parser = build_parser()
    args = parser.parse_args(["embed", "model", "in.txt", "--out", "o"])
    defaults = ServeConfig()
    assert dataclass_values(ServeConfig, args, EMBED_FLAGS) == {
        "instances": defaults.instances,
        "cores_per_instance": defaults.cores_per_instance,
        "max_batch_requests": defaults.max_batch_requests,
        "max_batch_tokens": OFFLINE_BATCH_TOKENS,  # embed's own default
    }
    args = parser.parse_args(["embed", "model", "in.txt", "--out", "o", "--max-batch-tokens", "9"])
    assert dataclass_values(ServeConfig, args, EMBED_FLAGS)["max_batch_tokens"] == 9


def test_serve_ray_flags_are_rayconfigs_fields():
    """--replicas, --cores-per-replica, --max-queued-requests come from RayConfig: none given
    is RayConfig(); given ones land in its fields; a zero is refused at parse time."""
    from squant.cli import build_parser
    from squant.commands.common import dataclass_from_args
    from squant.serve.ray_app import RayConfig

    parser = build_parser()
    args = parser.parse_args(["serve", "model", "--ray"])
    assert dataclass_from_args(RayConfig, args) == RayConfig()
    given = ["--replicas", "3", "--cores-per-replica", "2", "--max-queued-requests", "9"]
    args = parser.parse_args(["serve", "model", "--ray", *given])
    layout = dataclass_from_args(RayConfig, args)
    assert layout == RayConfig(replicas=3, cores_per_replica=2, max_queued_requests=9)
    assert layout.cores() == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "model", "--ray", "--replicas", "0"])
    with pytest.raises(SquantError, match="replicas must be at least 1"):
        RayConfig(replicas=0)


def test_serve_listen_flags_are_listenconfigs_fields():
    """--host, --port, --header-timeout, --access-log come from ListenConfig."""
    from squant.cli import build_parser
    from squant.commands.common import dataclass_from_args
    from squant.serve.listen import ListenConfig

    parser = build_parser()
    assert dataclass_from_args(ListenConfig, parser.parse_args(["serve", "m"])) == ListenConfig()
    given = ["--host", "0.0.0.0", "--port", "9001", "--header-timeout", "2.5", "--access-log"]
    args = parser.parse_args(["serve", "m", *given])
    want = ListenConfig(host="0.0.0.0", port=9001, header_timeout_s=2.5, access_log=True)
    assert dataclass_from_args(ListenConfig, args) == want
    for bad in (["--port", "0"], ["--header-timeout", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "m", *bad])
    with pytest.raises(SquantError, match="port"):
        ListenConfig(port=70000)


def test_serve_ray_on_a_directory_that_is_no_model_is_one_line_before_ray_starts(tmp_path, capsys):
    """Found by the CLI fuzz: `squant serve EMPTY_DIR --ray` deployed replicas that failed to
    load and ended in Ray's traceback; the model is now checked before Ray starts."""
    import ray

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["serve", str(empty), "--ray", "--port", "8931"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("squant serve: error:") and "tokenizer" in err[-1]
    assert not ray.is_initialized()


@pytest.mark.compile
def test_export_quantizes_a_float_checkpoint_first_and_says_so_before_exporting(
    tiny_checkpoint, calib_jsonl, tmp_path
):
    from squant.checkpoint.pipeline import export_checkpoint
    from squant.runtime.export import ExportConfig

    said: list[str] = []
    result = export_checkpoint(
        tiny_checkpoint,
        tmp_path / "deploy",
        calib_jsonl,
        export_config=ExportConfig(batch=1, seq=8),
        say=said.append,
    )
    assert result.package.is_file() and result.package.parent == tmp_path / "deploy"
    assert result.source.resolve() == tiny_checkpoint.resolve()
    assert result.report is not None and said == result.report.lines()
    assert result.seconds > 0 and said[0].startswith("quantized ")

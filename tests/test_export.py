"""AOTInductor packages: built once, loaded in a fresh process with PyTorch alone."""

import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import squant
from squant.errors import SquantError
from squant.hardware import cpu_features
from squant.runtime.export import KERNEL_LIBRARY, MANIFEST, REQUIRED_ISA, check_host
from tests.helpers import tiny_model, token_batches

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model = tiny_model("bert", "sequence-classification", outliers=True)
    q = squant.quantize(
        model, squant.SmoothQuantConfig(mode="static"), token_batches(), progress=False
    )
    inputs = token_batches(n=1, seed=3)[0]
    directory = tmp_path_factory.mktemp("export")
    squant.export(q, directory, inputs, config=squant.ExportConfig(float_dtype="fp32"))
    config = squant.CompileConfig(float_dtype="fp32", attention="squant")
    compiled = squant.compile(q, config, inputs)
    with torch.no_grad():
        expected = compiled(**inputs).logits
    return directory, inputs, expected, q


def test_package_runs_in_a_fresh_process_without_squant(exported, tmp_path):
    directory, inputs, expected, _ = exported
    torch.save(dict(inputs), tmp_path / "inputs.pt")
    script = textwrap.dedent(
        f"""
        import sys, torch
        # the int8 attention kernel (the default) ships beside the package
        torch.ops.load_library({str(directory / KERNEL_LIBRARY)!r})
        runner = torch._inductor.aoti_load_package({str(directory / "model.pt2")!r})
        x = torch.load({str(tmp_path / "inputs.pt")!r})
        out = runner(x["input_ids"], x["attention_mask"], torch.zeros_like(x["input_ids"]))
        torch.save(out[0], {str(tmp_path / "out.pt")!r})
        assert "squant" not in sys.modules and "transformers" not in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    got = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))


def test_manifest_records_what_the_package_is(exported):
    directory, _, _, q = exported
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["model_class"] == "BertForSequenceClassification"
    assert manifest["quantization"]["config"]["mode"] == "static"
    assert manifest["batch"] == 4
    assert manifest["seq"] == 12
    assert manifest["built_on"]["int8_path"]
    assert manifest["torch_version"] == torch.__version__
    assert len(manifest["quantization"]["modules"]) == len(q.squant_info.modules)


def test_load_exported_checks_the_isa(exported):
    directory, inputs, expected, _ = exported
    runner = squant.load_exported(directory)
    out = runner(inputs["input_ids"], inputs["attention_mask"])
    torch.testing.assert_close(out[0], expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))
    # a package built on a CPU with an instruction set this one lacks (on an AMX host, an
    # instruction set no x86 CPU reports stands in for it)
    lacking = next((f for f in REQUIRED_ISA if not cpu_features().has(f)), "avx10_9")
    with pytest.raises(SquantError, match=lacking):
        check_host({"requires_isa": [lacking]})


def test_load_exported_errors(tmp_path):
    with pytest.raises(SquantError, match="not a squant export"):
        squant.load_exported(tmp_path)


def test_dynamic_sequence_length_package(deploy_dir):
    quantized, deploy = deploy_dir  # exported with --dynamic-seq at the example's length
    assert json.loads((deploy / MANIFEST).read_text())["seq"] is None
    q, runner = squant.load(quantized), squant.load_exported(deploy)
    for seq in (3, 20, 64):  # shorter and longer than the 16-token example, up to the limit
        x = token_batches(n=1, batch=2, seq=seq, seed=5)[0]
        x["input_ids"] = x["input_ids"] % q.config.vocab_size
        with torch.no_grad():
            ref = q(**x).logits
        out = runner(x["input_ids"], x["attention_mask"])[0]
        torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))


# --- trust: what load_exported checks before torch sees the package -----------------------


def _copy_export(exported, tmp_path):
    import shutil

    directory = exported[0]
    dst = tmp_path / "deploy"
    shutil.copytree(directory, dst)
    return dst


def _rewrite_manifest(directory, **changes):
    path = directory / MANIFEST
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def _rehash(directory):
    from squant.runtime.export import _sha256

    _rewrite_manifest(directory, sha256=_sha256(directory / "model.pt2"))


def test_zip_slip_member_is_refused_and_nothing_is_written_outside(exported, tmp_path):
    import zipfile

    deploy = _copy_export(exported, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    with zipfile.ZipFile(deploy / "model.pt2", "a") as z:
        z.writestr(f"model/data/aotinductor/model/../../../../{victim.name}", "overwritten")
    _rehash(deploy)  # the attacker also fixed the manifest: the member check must catch it
    with pytest.raises(SquantError, match="unsafe archive member"):
        squant.load_exported(deploy)
    assert victim.read_text() == "precious"


def test_a_package_changed_after_export_is_refused(exported, tmp_path):
    deploy = _copy_export(exported, tmp_path)
    with (deploy / "model.pt2").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(SquantError, match="SHA-256"):
        squant.load_exported(deploy)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The temp directory (Python's and torch's) moved where a test can see what is left."""
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


@pytest.mark.parametrize("content", [b"", b"random bytes, not a zip", "truncate"])
def test_corrupt_package_is_one_clear_error_and_leaves_nothing(
    exported, tmp_path, content, private_tmp
):
    deploy = _copy_export(exported, tmp_path)
    package = deploy / "model.pt2"
    data = package.read_bytes()
    package.write_bytes(data[: len(data) // 2] if content == "truncate" else content)
    _rehash(deploy)
    with pytest.raises(SquantError, match=r"not a valid package|empty archive|cannot load"):
        squant.load_exported(deploy)
    assert list(private_tmp.iterdir()) == []  # no extraction left behind


def test_a_package_whose_library_does_not_load_leaves_no_extraction(
    exported, tmp_path, private_tmp
):
    """A valid archive whose compiled library is garbage: torch extracts it, then fails."""
    import zipfile

    deploy = _copy_export(exported, tmp_path)
    package = deploy / "model.pt2"
    with zipfile.ZipFile(package) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    with zipfile.ZipFile(package, "w") as z:
        for info, data in members:
            z.writestr(info, b"not a shared library" if info.filename.endswith(".so") else data)
    _rehash(deploy)
    with pytest.raises(SquantError, match="cannot load"):
        squant.load_exported(deploy)
    assert list(private_tmp.iterdir()) == []


def test_a_loaded_package_removes_its_extraction_when_freed(exported, private_tmp):
    import gc

    directory, *_ = exported
    loaded = squant.load_exported(directory)
    assert list(private_tmp.iterdir())  # extracted while in use
    del loaded
    gc.collect()
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ("[1, 2]", "not a squant export manifest"),
        (b"\xff\xfe\x00", "corrupt"),
        ({"requires_isa": None}, "requires_isa"),
        ({"requires_isa": "avx2"}, "requires_isa"),
        ({"requires_isa": ["rm -rf"]}, "requires_isa must list"),
        ({"torch_version": "1.0.0"}, "built with torch 1.0.0"),
        ({"format_version": None}, "format version"),
        ({"batch": "4"}, "'batch'"),
        ({"seq": None}, "seq and dynamic_seq disagree"),
        ({"sha256": "abc"}, "not a SHA-256"),
    ],
)
def test_malformed_manifest_is_one_clear_error(exported, tmp_path, manifest, message):
    deploy = _copy_export(exported, tmp_path)
    if isinstance(manifest, dict):
        _rewrite_manifest(deploy, **manifest)
    else:
        data = manifest if isinstance(manifest, bytes) else manifest.encode()
        (deploy / MANIFEST).write_bytes(data)
    with pytest.raises(SquantError, match=message):
        squant.load_exported(deploy)


def test_the_runner_checks_its_inputs(exported):
    directory, inputs, expected, _ = exported  # exported for [4, 12]
    runner = squant.load_exported(directory)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    out = runner(ids.to(torch.int32), mask.to(torch.int32))  # int32 is widened, not misread
    torch.testing.assert_close(out[0], expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))
    cases = [
        ((ids.repeat(1, 4)[:, :40], mask.repeat(1, 4)[:, :40]), "sequence length 12, got 40"),
        ((ids[:0], mask[:0]), "batch 4, got 0"),
        ((ids[:1], mask[:1]), "batch 4, got 1"),
        ((ids.float(), mask), "must hold integers"),
        ((ids[0], mask[0]), r"must be \[batch, seq\]"),
        ((ids + 10_000, mask), "outside"),
        ((ids, mask * 3), "only 0 and 1"),
        (("ids", mask), "must be a tensor"),
    ]
    for args, message in cases:
        with pytest.raises(SquantError, match=message):
            runner(*args)


def test_squants_runner_runs_the_package_on_64_byte_aligned_weights(exported):
    # AOTInductor's CPU runtime keeps a package's constants in one std::malloc block, 16 bytes
    # into a cache line here; squant's runner moves them to aligned tensors at load
    from torch._inductor.package import load_package

    from squant.kernels.package_runner import NativePackageRunner

    directory, inputs, _, _ = exported
    loaded = squant.load_exported(directory)
    assert isinstance(loaded.runner, NativePackageRunner)
    assert torch.ops.squant.package_constant_alignment(loaded.runner.handle) == 64
    # the runtime's own block is freed at load: memory handed out now would be read by any
    # constant still pointing into it (this model has oneDNN-packed float weights too)
    scribbled = [torch.full((1 << 16,), 7.0) for _ in range(64)]
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    args = (ids, mask, torch.zeros_like(ids))
    ours = loaded.runner(*args)
    binding = load_package(str(directory / "model.pt2"))
    for a, b in zip(ours, binding(*args), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same weights, moved
    del scribbled


def test_runner_takes_segments_where_the_architecture_has_them(exported):
    directory, inputs, expected, q = exported
    runner = squant.load_exported(directory)
    assert runner.input_names == ("input_ids", "attention_mask", "token_type_ids")
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    types = torch.zeros_like(ids)
    types[:, 6:] = 1  # a sentence pair: segments change the output
    with torch.no_grad():
        ref = q(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    out = runner(ids, mask, types)[0]
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))
    assert not torch.allclose(out, expected)
    with pytest.raises(SquantError, match=r"token_type_ids outside \[0, 2\)"):
        runner(ids, mask, types * 2)


def test_packaged_model_is_called_like_the_hf_model_at_any_batch(exported):
    directory, _, _, q = exported  # exported for [4, 12]
    from squant.runtime.shapes import PaddedShapes

    packaged = squant.load_packaged(directory)
    assert packaged.config.num_labels == q.config.num_labels  # config.json beside the package
    assert packaged.squant_info.config.mode == "static"
    shaped = PaddedShapes(packaged, batch=4, buckets=(12,))
    for x in token_batches(n=2, batch=6, seq=7, seed=11):  # 6 rows, 7 and 10 tokens
        with torch.no_grad():
            ref = q(**x).logits
        got = shaped(**x).logits
        torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))


def test_version_2_packages_still_load(exported, tmp_path):
    directory, inputs, expected, _ = exported
    import shutil

    old = tmp_path / "old"
    shutil.copytree(directory, old)
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["format_version"] = 2
    del manifest["output_names"], manifest["type_vocab_size"]
    (old / MANIFEST).write_text(json.dumps(manifest))
    runner = squant.load_exported(old)
    assert runner.output_names == ("output_0",)
    out = runner(inputs["input_ids"], inputs["attention_mask"])[0]
    torch.testing.assert_close(out, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))


def _rename_member_bytes(package, old: bytes, new: bytes, utf8_flag: bool) -> None:
    """Rewrite a member's name bytes in place (local header and central directory), with the
    UTF-8 flag (bit 11) set or cleared: what a hand-crafted archive can hold."""
    import struct

    assert len(old) == len(new)
    data = bytearray(package.read_bytes())
    for signature, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        start = 0
        while (at := data.find(signature, start)) >= 0:
            start = at + 4
            name_at = at + (30 if signature == b"PK\x03\x04" else 46)
            if data[name_at : name_at + len(old)] != old:
                continue
            data[name_at : name_at + len(old)] = new
            (flags,) = struct.unpack_from("<H", data, at + flag_at)
            flags = flags | 0x800 if utf8_flag else flags & ~0x800
            struct.pack_into("<H", data, at + flag_at, flags)
    package.write_bytes(bytes(data))


@pytest.mark.parametrize("utf8_flag", [True, False])
def test_a_member_name_that_is_not_utf8_is_one_clear_error(
    exported, tmp_path, private_tmp, utf8_flag
):
    import zipfile

    deploy = _copy_export(exported, tmp_path)
    package = deploy / "model.pt2"
    with zipfile.ZipFile(package) as z:
        root = z.infolist()[0].filename.split("/")[0]
    with zipfile.ZipFile(package, "a") as z:
        z.writestr(f"{root}/extra/AAAA", b"x")
    _rename_member_bytes(
        package,
        f"{root}/extra/AAAA".encode(),
        f"{root}/extra/\xff\xfe\x80\x81".encode("latin-1"),
        utf8_flag,
    )
    _rehash(deploy)
    if utf8_flag:  # flagged UTF-8 but not: zipfile's own reader fails on it
        with pytest.raises(SquantError, match=r"not a valid package"):
            squant.load_exported(deploy)
    else:  # a cp437 name: a valid archive; refused by a loader, or loaded and cleaned up
        import gc

        message = None
        try:
            loaded = squant.load_exported(deploy)
        except SquantError as e:
            message = str(e)
        else:
            del loaded
            gc.collect()
        assert message is None or re.search(r"unsafe archive member|cannot load", message)
    assert list(private_tmp.iterdir()) == []


def test_named_outputs_read_by_name_attribute_and_position_as_model_output_does():
    from squant.runtime.outputs import NamedOutputs

    h, p = torch.zeros(2, 3, 4), torch.ones(2, 4)
    out = NamedOutputs(last_hidden_state=h, pooler_output=p)
    assert out[0] is h and out[1] is p and out[-1] is p
    assert out["pooler_output"] is p and out.last_hidden_state is h
    with pytest.raises(IndexError, match="out of range"):
        out[2]
    with pytest.raises(KeyError):
        out["logits"]

import pytest
import transformers

from squant.data import read_texts, tokenize
from squant.errors import SquantError


def test_read_texts_formats(tmp_path):
    (tmp_path / "a.txt").write_text("one sentence\n\n  \nleft\tright\n")
    assert read_texts(tmp_path / "a.txt") == ["one sentence", ("left", "right")]
    (tmp_path / "b.jsonl").write_text(
        '{"premise": "p", "hypothesis": "h"}\n"bare"\n{"text": "t", "label": 1}\n'
    )
    assert read_texts(tmp_path / "b.jsonl") == [("p", "h"), "bare", "t"]
    assert read_texts(tmp_path / "b.jsonl", limit=1) == [("p", "h")]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", "\n  \n", "holds no text"),
        ("bad.jsonl", '{"text": "ok"}\n{oops\n', r"bad.jsonl:2: not valid JSON"),
        ("nofield.jsonl", '{"label": 3}\n', "no text field"),
        ("latin1.txt", b"caf\xe9\n", "not UTF-8"),
    ],
)
def test_read_texts_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(SquantError, match=message):
        read_texts(path)


def test_missing_file(tmp_path):
    with pytest.raises(SquantError, match="does not exist"):
        read_texts(tmp_path / "nope.txt")


def test_text_that_tokenizes_to_nothing_is_refused(tiny_checkpoint):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    batches = tokenize(tok, [("the cat", "sat"), ("a dog", "runs")], batch_size=1, max_length=16)
    assert len(batches) == 2
    with pytest.raises(SquantError, match="mix single sentences and pairs"):
        tokenize(tok, ["the cat", ("a dog", "runs")], batch_size=1, max_length=16)
    with pytest.raises(SquantError, match="nothing but special tokens"):
        tokenize(tok, ["\u2603\u2603", "\u2603"], batch_size=2)


def test_coverage_adds_empty_short_and_long_inputs(tiny_checkpoint):
    tok = transformers.AutoTokenizer.from_pretrained(str(tiny_checkpoint))
    texts = ["the cat sat on the mat", "a man plays music in the park"] * 10
    plain = tokenize(tok, texts, batch_size=8, max_length=16)
    covered = tokenize(tok, texts, batch_size=8, max_length=16, coverage_length=48)
    extra = covered[len(plain) :]
    lengths = sorted(int(n) for b in extra for n in b["attention_mask"].sum(1))
    assert lengths[0] == 2  # an empty text: [CLS] [SEP] only
    assert 3 in lengths  # one word
    assert lengths[-1] == 48  # packed documents reach the coverage length
    assert max(int(b["attention_mask"].sum(1).max()) for b in plain) <= 16
    pairs = tokenize(tok, [("the cat", "a dog runs")] * 4, 2, 16, coverage_length=32)
    assert "token_type_ids" in pairs[-3] and int(pairs[-3]["token_type_ids"].max()) == 1

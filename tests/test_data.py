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

"""The built-in byte tokenizer and a Hugging Face tokenizer read from a local file."""

from __future__ import annotations

import pytest

from schedkit.http.tokenizer import ByteTokenizer, HfTokenizer, load_tokenizer


def test_text_is_one_token_per_utf8_byte_and_decodes_back():
    tok = ByteTokenizer(32000)
    assert tok.encode("ab é") == [97, 98, 32, 195, 169]
    assert tok.decode(tok.encode("ab é")) == "ab é"


def test_ids_past_the_bytes_are_words_and_eos_is_nothing():
    tok = ByteTokenizer(32000, eos_token_id=2)
    assert tok.decode([256]) == " jw"  # 256 = 9 * 26 + 22
    assert tok.decode([0 + 26]) == "\x1a"
    assert tok.decode([256, 2, 257]) == " jw jx"
    assert ByteTokenizer(32000, eos_token_id=300).decode([300]) == ""


def test_the_words_kept_are_bounded():
    tok = ByteTokenizer(80_000)
    ids = range(256, 80_000)
    assert tok.decode(ids).split() == [tok.decode([i]).strip() for i in ids]
    assert len(tok.piece.__self__) <= 1 << 16


def test_incremental_decoding_waits_for_the_rest_of_a_character():
    decoder = ByteTokenizer(32000).incremental()
    assert decoder.decode([195]) == ""
    assert decoder.decode([169, 256]) == "é jw"
    assert decoder.decode([195], final=True) == "\ufffd"
    decoder = ByteTokenizer(32000).incremental()
    assert decoder.decode([226, 130]) == ""
    assert decoder.decode([172, 97]) == "€a"  # ASCII after a split character
    assert decoder.decode([98, 256]) == "b jw"
    assert decoder.decode([226]) == ""
    assert decoder.decode([97]) == "\ufffda"  # a broken character before ASCII


def test_a_vocabulary_smaller_than_the_bytes_is_refused():
    with pytest.raises(ValueError, match=">= 256"):
        ByteTokenizer(100)


def test_a_hugging_face_tokenizer_from_a_local_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    built = tokenizers.Tokenizer(model)
    built.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    built.decoder = tokenizers.decoders.WordPiece()
    path = tmp_path / "tokenizer.json"
    built.save(str(path))
    tok = load_tokenizer(str(path), 32000, None)
    assert isinstance(tok, HfTokenizer)
    assert tok.encode("hello world again") == [1, 2, 3]
    assert tok.decode([1, 2]) == "hello world"
    decoder = tok.incremental()
    assert decoder.decode([1]) + decoder.decode([2, 3], final=True) == "hello world again"


def test_a_file_that_is_no_tokenizer_is_named(tmp_path):
    pytest.importorskip("tokenizers")
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"not a tokenizer\.json"):
        HfTokenizer(str(path))

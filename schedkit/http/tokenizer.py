"""Text to token ids and back: a deterministic built-in tokenizer, or a Hugging Face tokenizer
read from a local ``tokenizer.json`` (the optional ``tokenizers`` package).

The built-in tokenizer is byte-level: text is encoded as UTF-8 and each byte is one token whose
id is the byte's value (0-255). Ids from 256 to the vocabulary size minus one (the model
preset's vocabulary) decode to a word of their own, a space then lowercase letters spelling the
id in base 26 (``256`` -> ``" jw"``); the EOS id, when the model has one, decodes to nothing.
Decoding ids below 256 yields their bytes, read as UTF-8 across token boundaries (an
incomplete sequence at the end of a stream waits for its next byte; an invalid one becomes
U+FFFD).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Protocol

__all__ = ["ByteTokenizer", "HfTokenizer", "IncrementalDecoder", "Tokenizer", "load_tokenizer"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class IncrementalDecoder(Protocol):
    """Turns the ids of one generation, a few at a time, into the text they add."""

    def decode(self, ids: Sequence[int], final: bool = False) -> str:
        """The text that ``ids`` add to what was decoded before."""
        ...


class Tokenizer(Protocol):
    """What the front end asks of a tokenizer."""

    name: str

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``."""
        ...

    def incremental(self) -> IncrementalDecoder:
        """A fresh decoder for one stream of generated ids."""
        ...


def _word(token_id: int) -> bytes:
    letters = []
    while True:
        token_id, digit = divmod(token_id, 26)
        letters.append(_LETTERS[digit])
        if not token_id:
            break
    return (" " + "".join(reversed(letters))).encode()


class _Pieces(dict):
    """Token id -> bytes, filled as ids are met; at most ``_PIECES`` words are kept."""

    def __missing__(self, token_id: int) -> bytes:
        piece = _word(token_id)
        if len(self) < _PIECES:
            self[token_id] = piece
        return piece


_PIECES = 1 << 16


class ByteTokenizer:
    """The built-in tokenizer (see the module docstring)."""

    name = "schedkit-bytes"

    def __init__(self, vocab_size: int, eos_token_id: int | None = None) -> None:
        if vocab_size < 256:
            raise ValueError(
                f"the byte tokenizer needs a vocabulary of >= 256 ids, got {vocab_size}"
            )
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        pieces = _Pieces((i, bytes((i,))) for i in range(256))
        if eos_token_id is not None:
            pieces[eos_token_id] = b""
        # A dict lookup per id from C (map over __getitem__), Python only for a new word.
        self.piece = pieces.__getitem__

    def encode(self, text: str) -> list[int]:
        """One id per UTF-8 byte of ``text``."""
        return list(text.encode("utf-8", "surrogatepass"))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (invalid UTF-8 becomes U+FFFD)."""
        return b"".join(map(self.piece, ids)).decode("utf-8", "replace")

    def incremental(self) -> _ByteDecoder:
        """A decoder that keeps an incomplete UTF-8 sequence until its next byte."""
        return _ByteDecoder(self)


class _ByteDecoder:
    __slots__ = ("_decoder", "_pending", "_piece")

    def __init__(self, tokenizer: ByteTokenizer) -> None:
        self._piece = tokenizer.piece
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending = False  # the decoder holds the start of a character

    def decode(self, ids: Sequence[int], final: bool = False) -> str:
        data = b"".join(map(self._piece, ids))
        if not self._pending and data.isascii():
            return data.decode("ascii")
        text = self._decoder.decode(data, final)
        self._pending = bool(self._decoder.getstate()[0])
        return text


class HfTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer read from a local ``tokenizer.json``."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as _HfTokenizer
        except ImportError:
            raise ValueError(
                f"--tokenizer {path}: the optional 'tokenizers' package is not installed "
                "(pip install tokenizers), or leave --tokenizer out for the built-in tokenizer"
            ) from None
        try:
            self._tokenizer = _HfTokenizer.from_file(path)
        except Exception as exc:  # the library raises its own error types
            raise ValueError(f"--tokenizer {path}: not a tokenizer.json file: {exc}") from None
        self.name = path

    def encode(self, text: str) -> list[int]:
        """The ids the tokenizer gives ``text``, without special tokens."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens left out."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def incremental(self) -> _HfDecoder:
        """A decoder that re-decodes the whole generation and emits what it adds."""
        return _HfDecoder(self)


class _HfDecoder:
    __slots__ = ("_ids", "_sent", "_tokenizer")

    def __init__(self, tokenizer: HfTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._sent = 0

    def decode(self, ids: Sequence[int], final: bool = False) -> str:
        self._ids += ids
        text = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd") and not final:  # an incomplete character: wait for more
            return ""
        new, self._sent = text[self._sent :], len(text)
        return new


def load_tokenizer(
    path: str | None, vocab_size: int, eos_token_id: int | None
) -> ByteTokenizer | HfTokenizer:
    """The Hugging Face tokenizer at ``path``, or the built-in one without a path."""
    if path is None:
        return ByteTokenizer(vocab_size, eos_token_id)
    return HfTokenizer(path)

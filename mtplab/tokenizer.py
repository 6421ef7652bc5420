"""Byte-level tokenizer: every UTF-8 byte is a token, vocabulary 256.

Any `str` encodes; any list of ids decodes (invalid UTF-8 pieces become U+FFFD),
so a widget can print half of a multi-byte character without raising.
"""
from __future__ import annotations


def encode(text: str) -> list[int]:
    if not isinstance(text, str):
        raise TypeError(f"encode() takes a str, got {type(text).__name__}; decode bytes first")
    return list(text.encode("utf-8"))


def decode(ids) -> str:
    data = bytes(int(i) for i in ids)
    return data.decode("utf-8", errors="replace")


def token_repr(i: int) -> str:
    """A printable label for one byte token (used by widgets and tables)."""
    i = int(i)
    if i == 10:
        return "\\n"
    if i == 9:
        return "\\t"
    if i == 32:
        return "␣"
    if 32 < i < 127:
        return chr(i)
    return f"<{i:02x}>"

"""Stream a large JSON document whose bulk is one array, without building the document.

A profiler trace is `{"...": ..., "traceEvents": [ev, ev, ...], "...": ...}` where
the array holds nearly every byte. `scan(read)` walks the top-level object key by
key: small values are decoded whole and yielded as `(key, value)`; the array under
`array_key` is yielded as `(key, batch)` for successive batches of its elements,
so memory stays bounded by the chunk size, not the file size. A bare top-level
array (Chrome's "JSON Array Format") is yielded as `(array_key, batch)` too.

Speed: each refill tries to decode every complete element in the buffer with one
`json.loads` over "[" + text up to the last "}," + "]". That cut can only decode
successfully when it falls between two top-level elements (a cut inside a string
or a nested object leaves something unclosed, so decoding fails), in which case
the elements are decoded one by one with `raw_decode` instead. Either way the
result is exact.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

CHUNK_CHARS = 1 << 22  # characters read per refill
MAX_LOOKAHEAD = 1 << 26  # a single value larger than this is reported as malformed
_END_MARGIN = 16  # a literal cut by the end of the buffer fails this close to the end

_WS = re.compile(r"[ \t\n\r]*")
_STRUCTURE = re.compile(r"[,:{}\[\]\"]")
_DECODER = json.JSONDecoder()


class JsonStreamError(Exception):
    """The document is malformed or ends early; `line` is 1-based, `truncated` says which."""

    def __init__(self, message: str, line: int, truncated: bool) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.truncated = truncated


class _Buffer:
    """A sliding window over the text: `text[pos:]` is what is left to parse."""

    def __init__(self, read: Callable[[int], str], chunk: int) -> None:
        self.read = read
        self.chunk = chunk
        self.text = ""
        self.pos = 0
        self.eof = False
        self.dropped_lines = 0  # newlines in text already discarded

    def fill(self) -> None:
        """Discard what was parsed and append the next chunk (sets eof at the end)."""
        if self.pos:
            self.dropped_lines += self.text.count("\n", 0, self.pos)
            self.text = self.text[self.pos :]
            self.pos = 0
        more = self.read(self.chunk)
        if more:
            self.text += more
        else:
            self.eof = True

    def line_at(self, pos: int) -> int:
        return self.dropped_lines + self.text.count("\n", 0, min(pos, len(self.text))) + 1

    def skip_ws(self) -> None:
        while True:
            self.pos = _WS.match(self.text, self.pos).end()
            if self.pos < len(self.text) or self.eof:
                return
            self.fill()

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, chars: str, where: str) -> str:
        c = self.peek()
        if c == "" or c not in chars:
            self.fail(f"expected {' or '.join(repr(x) for x in chars)} {where}", self.pos)
        self.pos += 1
        return c

    def fail(self, message: str, pos: int) -> None:
        truncated = self.eof and pos >= len(self.text)
        if truncated:
            message = f"the file ends early ({message})"
        raise JsonStreamError(message, self.line_at(pos), truncated)

    def value(self, where: str) -> Any:
        """Decode the value at pos, reading more until it is complete."""
        self.skip_ws()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                # An error at the end of what was read (or a string still open) may
                # only mean "not read yet"; anything else is a real syntax error.
                rest = self.text[exc.pos :]
                cut_off = exc.msg.startswith("Unterminated string") or (
                    len(rest) <= _END_MARGIN and not _STRUCTURE.search(rest)
                )
                if cut_off and not self.eof and len(self.text) - exc.pos < MAX_LOOKAHEAD:
                    self.fill()
                    continue
                truncated = cut_off and self.eof
                what = "the file ends inside" if truncated else "malformed JSON in"
                raise JsonStreamError(
                    f"{what} {where}: {exc.msg}", self.line_at(exc.pos), truncated
                ) from None
            # A number that stops exactly at the buffer end may continue in the next chunk.
            if end == len(self.text) and not self.eof:
                self.fill()
                continue
            self.pos = end
            return value


def _bulk(buf: _Buffer, stop_before: int) -> list[Any] | None:
    """Every complete element up to the last '},' in the buffer, or None if that cut
    is not between two top-level elements."""
    cut = buf.text.rfind("},", buf.pos)
    if cut <= buf.pos or cut < stop_before:
        return None
    try:
        batch = json.loads("[" + buf.text[buf.pos : cut + 1] + "]")
    except ValueError:
        return None
    buf.pos = cut + 2
    return batch


def _array(buf: _Buffer, key: str) -> Iterator[list[Any]]:
    """Batches of the array's elements; the opening '[' is already consumed."""
    if buf.peek() == "]":
        buf.pos += 1
        return
    slow_until = -1  # after a failed bulk cut, go element by element past it
    index = 0
    while True:
        if not buf.eof and len(buf.text) - buf.pos < buf.chunk:
            buf.fill()
        batch = _bulk(buf, slow_until) if buf.pos >= slow_until else None
        if batch is not None:
            index += len(batch)
            yield batch
            continue
        if buf.pos >= slow_until:
            slow_until = buf.text.rfind("},", buf.pos) + 1
        yield [buf.value(f"{key} element {index}")]
        index += 1
        if buf.expect(",]", f"after {key} element {index - 1}") == "]":
            return
        buf.skip_ws()


def scan(
    read: Callable[[int], str], array_key: str = "traceEvents", chunk: int = CHUNK_CHARS
) -> Iterator[tuple[str, Any]]:
    """Yield (key, value) for the top-level object's keys, and (array_key, batch)
    repeatedly for the big array (see module doc). Raises JsonStreamError."""
    buf = _Buffer(read, chunk)
    buf.fill()
    first = buf.peek()
    if first == "[":
        buf.pos += 1
        for batch in _array(buf, array_key):
            yield array_key, batch
        return
    buf.expect("{", "at the start of the document")
    if buf.peek() == "}":
        return
    while True:
        key = buf.value("a top-level key")
        if not isinstance(key, str):
            buf.fail("a top-level key is not a string", buf.pos)
        buf.expect(":", f"after key {key!r}")
        if key == array_key and buf.peek() == "[":
            buf.pos += 1
            for batch in _array(buf, key):
                yield key, batch
        else:
            yield key, buf.value(f"the value of {key!r}")
        if buf.expect(",}", f"after the value of {key!r}") == "}":
            return

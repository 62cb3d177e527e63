"""One output line per input line: text and JSON made safe for line-based readers."""

from __future__ import annotations

import json

# What line readers split on (Python's str.splitlines, and so most tools that read lines): an
# output line holding one of these would read back as several lines.
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


_BREAKS_TO_SPACES = str.maketrans({char: " " for char in LINE_BREAKS})


_BREAKS_AND_TABS_TO_SPACES = str.maketrans({char: " " for char in LINE_BREAKS + "\t"})


def one_line(text: str, tabs: bool = False) -> str:
    """`text` with every line-break character (LINE_BREAKS) replaced by a space, and with `tabs`,
    every TAB too (for TAB-separated columns). Same length: character offsets stay valid."""
    return text.translate(_BREAKS_AND_TABS_TO_SPACES if tabs else _BREAKS_TO_SPACES)


# Characters json.dumps(ensure_ascii=False) writes as they are that str.splitlines() splits on.
_JSON_LINE_BREAKS = str.maketrans({char: f"\\u{ord(char):04x}" for char in "\x85\u2028\u2029"})


def json_line(record: object) -> str:
    """`record` as one line of JSON (UTF-8 text kept as is, no newline): json.dumps escapes every
    other LINE_BREAKS character itself; U+0085, U+2028 and U+2029 are escaped here, so the line
    reads back as one line with any line reader."""
    return json.dumps(record, ensure_ascii=False).translate(_JSON_LINE_BREAKS)

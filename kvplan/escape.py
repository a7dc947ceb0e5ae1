"""Escape a value from a config, YAML file, Hub answer or file name for the sink it is printed to.

Every function is pure and total: it takes any str (lone surrogates, control bytes, markup, 100 KB of it) and
returns text that is safe for one sink, never raising. Layers, from the inside out:

- `text`: one printable line. Control characters (C0, DEL, C1), bidirectional overrides and line separators
  become visible escapes (ESC -> `\\x1b`, newline -> `\\n`, U+202E -> `\\u202e`), so a value can neither move
  the cursor, open an OSC hyperlink, reorder what is shown, nor start a new line. Lone surrogates (a YAML
  "\\ud800", or an undecodable byte in a file name, which Python holds as U+DC80..U+DCFF) become `\\ud800` /
  `\\xff`, so no encoder ever fails on them.
- `ci_text`: `text`, and no CI log command can start inside it. GitHub Actions runs a line that starts with
  `::` after leading whitespace; its older `##[` form and Azure Pipelines' `##vso[` (and TeamCity's
  `##teamcity[`) are found anywhere in a line. A value may land at a line start when a renderer wraps, so a
  backslash goes between every two adjacent `:` and every two adjacent `#`: `::error` -> `:\\:error`.
- `markup`: `ci_text` with rich markup escaped (`[/x]`, `[link=...]` print as typed), for rich consoles.
- `gh_data` / `gh_property`: `ci_text` in GitHub's workflow-command encoding (`%`, CR, LF; and `:`, `,` in
  properties). Here a newline is kept as `%0A`: GitHub shows it inside the annotation, never as a log line.
- `xml_text`: `ci_text` restricted to XML 1.0's characters (U+FFFE/U+FFFF dropped as visible escapes).
- `json_text`: a JSON document whose data is unchanged, with `##` written `#\\u0023` so that a CI scanner does
  not read a command inside a string (JSON has `#` only inside strings).
"""

from __future__ import annotations

import re

from rich.markup import escape as _rich_escape

# C0 controls, DEL, C1 controls; bidirectional embeddings, overrides and isolates (the "Trojan Source"
# characters); line and paragraph separators; the BOM / zero-width no-break space; lone surrogates; and the
# two XML 1.0 non-characters U+FFFE and U+FFFF.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff\ufffe\uffff]"
)
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CI_PAIRS = re.compile(r"([:#])(?=[:#])")
# A backslash before a bracket that opens no rich tag (rich.markup RE_TAGS: "[", one of a-z # / @, up to "]").
_BARE_ESCAPED_BRACKET = re.compile(r"\\\[(?![a-z#/@][^[]*?\])")
_TRAILING_BACKSLASHES = re.compile(r"(\\+)$")
_GH_DATA = str.maketrans({"%": "%25", "\r": "%0D", "\n": "%0A"})
_GH_PROPERTY = str.maketrans({"%": "%25", "\r": "%0D", "\n": "%0A", ":": "%3A", ",": "%2C"})


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if char in _SHORT:
        return _SHORT[char]
    if 0xDC80 <= code <= 0xDCFF:
        # An undecodable byte of a file name, held by Python as a surrogate (PEP 383): show the byte.
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def text(value: object) -> str:
    """One printable line: control, bidi and separator characters and lone surrogates as visible escapes."""
    return _UNSAFE.sub(_visible, str(value))


def ci_text(value: object) -> str:
    """`text`, with a backslash between adjacent `:`/`#` so no CI log command can start inside the value.

    "x\\n::error::INJECTED" -> "x\\\\n:\\\\:error:\\\\:INJECTED" (shown: x\\n:\\:error:\\:INJECTED).
    """
    return _CI_PAIRS.sub(r"\1\\", text(value))


def markup(value: object) -> str:
    """`ci_text` for a rich console: markup tags in the value print as typed instead of styling or crashing.

    rich's escape leaves a bracket that starts no tag alone, yet its renderer turns every backslash-bracket of
    plain text into a bare bracket ("\\[" would print as "["), so such a backslash gets a second one; and a run of
    n backslashes that ends the value, followed by kvplan's closing tag, prints as n / 2, so it is doubled.
    """
    doubled_tail = _TRAILING_BACKSLASHES.sub(r"\1\1", ci_text(value))
    return _BARE_ESCAPED_BRACKET.sub(r"\\\\[", _rich_escape(doubled_tail))


def gh_data(value: object) -> str:
    """`ci_text` as the message of a GitHub workflow command (`::error ...::MESSAGE`), newlines kept as %0A."""
    lines = str(value).replace("\r\n", "\n").split("\n")
    return "\n".join(map(ci_text, lines)).translate(_GH_DATA)


def gh_property(value: object) -> str:
    """`ci_text` as a property value of a GitHub workflow command (`file=...,title=...`)."""
    return ci_text(value).translate(_GH_PROPERTY)


def xml_text(value: object) -> str:
    """`ci_text` for JUnit XML: only characters XML 1.0 allows (ElementTree escapes <, & and quotes)."""
    return ci_text(value)


def json_text(document: str) -> str:
    """A JSON document with `##` written `#\\u0023`: the same data once parsed, no CI command in the text."""
    return document.replace("##", "#\\u0023")

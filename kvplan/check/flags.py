"""Parse an engine's argv the way its own parser would: flag values, booleans, positionals, prefixes.

`--max-num-seq 1024` is what vLLM's argparse reads as --max-num-seqs (a unique prefix), `--pipeline_parallel_size 2`
as --pipeline-parallel-size (vLLM rewrites underscores), `--enforce-eager MODEL` leaves MODEL positional because
--enforce-eager takes no value. Every flag comes back under its canonical name with its value as text
("true"/"false" for booleans), in command-line order; later occurrences win, as in the engines.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kvplan.check.flag_tables import ENGINES, EngineFlags, engine_versions
from kvplan.records import dataclass

_NUMBER_RE = re.compile(r"^-\d")
_BOOL_WORDS = {"true": "true", "false": "false", "1": "true", "0": "false", "yes": "true", "no": "false"}


@dataclass(frozen=True)
class ParsedArgs:
    """Flags and positionals of one engine command line."""

    engine: str
    flags: tuple[tuple[str, str], ...]
    positionals: tuple[str, ...]
    notes: tuple[str, ...]
    flag_lines: tuple[int | None, ...] = ()  # the file line of each flag, parallel to `flags`

    def __post_init__(self) -> None:
        if not self.flag_lines and self.flags:
            object.__setattr__(self, "flag_lines", (None,) * len(self.flags))

    def get(self, name: str) -> str | None:
        value = None
        for key, found in self.flags:
            if key == name:
                value = found
        return value

    def line(self, name: str) -> int | None:
        """The line of the occurrence of `name` that wins (the last one), when known."""
        found = None
        for (key, _), line in zip(self.flags, self.flag_lines, strict=True):
            if key == name and line is not None:
                found = line
        return found


def bool_word(text: str) -> str | None:
    """'True' / 'false' / '1' -> 'true' / 'false'; None when the word is not a boolean."""
    return _BOOL_WORDS.get(text.strip().lower())


def parse_args(
    engine: str,
    argv: Sequence[str],
    *,
    lines: Sequence[int | None] | None = None,
    extra_value: frozenset[str] = frozenset(),
    extra_boolean: frozenset[str] = frozenset(),
) -> ParsedArgs:
    """Parse `argv` (the words after the program name) with `engine`'s grammar plus any runtime extras.

    `lines` gives the file line of each word, so each flag can be reported where it is written.
    """
    grammar = ENGINES[engine]
    here: int | None = None
    flags: list[tuple[str, str]] = []
    flag_lines: list[int | None] = []
    positionals: list[str] = []
    notes: list[str] = []
    words = list(argv)
    word_lines = list(lines) if lines is not None else []
    word_lines += [None] * (len(words) - len(word_lines))
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        flag_lines += [here] * (len(flags) - len(flag_lines))  # the flags of the word read before
        here = word_lines[i - 1]
        if word == "--":
            positionals.extend(words[i:])
            break
        if not word.startswith("-") or word == "-" or _NUMBER_RE.match(word):
            positionals.append(word)
            continue
        if not word.startswith("--") and grammar is ENGINES["vllm"] and word.startswith("-O") and len(word) > 2:
            # vLLM's -O3 / -O.level=3 shorthand for the compilation config.
            flags.append(("compilation-config", word[2:].lstrip("=")))
            continue
        raw, has_value, inline = word.lstrip("-").partition("=")
        name, how = _canonical(grammar, raw, word.startswith("--"), extra_value | extra_boolean)
        if how:
            notes.append(f"{word.split('=')[0]} read as --{name} ({how})")
        negated = False
        if name is None and grammar.negatable and raw.replace("_", "-").startswith("no-"):
            positive, _ = _canonical(grammar, raw.replace("_", "-")[3:], True, frozenset())
            if positive in grammar.boolean:
                name, negated = positive, True
        if name is None:
            # Unknown to kvplan: keep it, and take the next word as its value when it is not a flag,
            # which is what most engine flags do.
            shown = raw.replace("_", "-") if grammar.underscores else raw
            if has_value:
                flags.append((shown, inline))
            elif i < len(words) and not words[i].startswith("-"):
                flags.append((shown, words[i]))
                i += 1
            else:
                flags.append((shown, "true"))
            versions = engine_versions(engine)
            known = f" (read from {engine} {', '.join(versions)})" if versions else ""
            notes.append(f"flag {word.split('=')[0]} is not a known {engine} flag{known}; kept as given")
            continue
        if negated:
            flags.append((name, "false"))
        elif name in grammar.boolean or name in extra_boolean:
            if has_value:
                flags.append((name, bool_word(inline) or inline))
            elif i < len(words) and bool_word(words[i]) in ("true", "false") and words[i].isalpha():
                # Older vLLM declared some switches with nargs='?' (`--enable-chunked-prefill false`).
                flags.append((name, bool_word(words[i]) or "true"))
                i += 1
            else:
                flags.append((name, "true"))
        elif name in grammar.multi:
            values = [inline] if has_value else []
            while i < len(words) and not words[i].startswith("-"):
                values.append(words[i])
                i += 1
            flags.append((name, " ".join(values)))
        elif name in grammar.optional:
            if has_value:
                flags.append((name, inline))
            elif i < len(words) and not words[i].startswith("-"):
                flags.append((name, words[i]))
                i += 1
            else:
                flags.append((name, "true"))
        elif has_value:
            flags.append((name, inline))
        elif i < len(words):
            flags.append((name, words[i]))
            i += 1
        else:
            notes.append(f"flag --{name} has no value")
    flag_lines += [here] * (len(flags) - len(flag_lines))
    return ParsedArgs(engine, tuple(flags), tuple(positionals), tuple(notes), tuple(flag_lines))


def _canonical(
    grammar: EngineFlags, raw: str, long_form: bool, extras: frozenset[str]
) -> tuple[str | None, str]:
    """Map a flag as written to its canonical name; the second value says how (prefix) or is ''."""
    name = raw.replace("_", "-") if grammar.underscores or raw.replace("_", "-") in extras else raw
    if name in grammar.aliases:
        return grammar.aliases[name], ""
    if name in grammar.names or name in extras:
        return name, ""
    if not long_form or not grammar.abbreviations or not name:
        return None, ""
    known = grammar.names | set(grammar.aliases) | extras
    candidates = {grammar.aliases.get(f, f) for f in known if f.startswith(name)}
    if len(candidates) == 1:
        return candidates.pop(), "unique prefix, as the engine's argument parser accepts it"
    return None, ""

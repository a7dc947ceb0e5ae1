"""Mask Helm/Go-template placeholders so a templated file still parses as YAML, keeping line numbers.

`hf_api_token: {{HF_TOKEN}}` is a flow mapping with an unhashable key to a strict YAML parser, and
`- --max-model-len={{ .Values.maxModelLen }}` hides the number kvplan needs. Each `{{ ... }}` becomes a
sentinel such as `__kvplan_tpl_3__`; extraction later turns any field that still holds one into an
Unresolved value that quotes the original template. Lines made only of template actions (`{{- if .x }}`,
`{{ toYaml .Values.resources | nindent 12 }}`) emit YAML nobody can know without rendering, so they become
comments. Every newline is kept, so the parser's line numbers stay those of the file.
"""

from __future__ import annotations

import re

_TEMPLATE_RE = re.compile(r"\{\{.*?\}\}", re.DOTALL)
_ONLY_TEMPLATES_RE = re.compile(r"^\s*(?:\{\{.*?\}\}\s*)+$")
SENTINEL_RE = re.compile(r"__kvplan_tpl_(\d+)__")


def mask_templates(text: str) -> tuple[str, tuple[str, ...]]:
    """Return the text with templates masked, and the original template of each sentinel by index."""
    if "{{" not in text:
        return text, ()
    originals: list[str] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _ONLY_TEMPLATES_RE.match(line):
            indent = line[: len(line) - len(line.lstrip())]
            lines[i] = f"{indent}# kvplan: template line masked"
    text = "\n".join(lines)

    def _replace(match: re.Match[str]) -> str:
        originals.append(match.group(0))
        # A template spanning lines keeps its newlines so later line numbers do not move.
        return f"__kvplan_tpl_{len(originals) - 1}__" + "\n" * match.group(0).count("\n")

    return _TEMPLATE_RE.sub(_replace, text), tuple(originals)


def find_template(value: object, originals: tuple[str, ...]) -> str | None:
    """The original template text hidden in `value`, or None when the value is not templated."""
    if not isinstance(value, str):
        return None
    match = SENTINEL_RE.search(value)
    if match is None:
        return None
    index = int(match.group(1))
    return originals[index] if index < len(originals) else match.group(0)


def unmask(value: str, originals: tuple[str, ...]) -> str:
    """Put the original templates back into a string, for messages and the flag listing."""

    def _back(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return originals[index] if index < len(originals) else match.group(0)

    return SENTINEL_RE.sub(_back, value)

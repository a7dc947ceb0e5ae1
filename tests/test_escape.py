"""kvplan.escape: each sink's escape is total, keeps values on one line, and lets no CI command through."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from kvplan.escape import ci_text, gh_data, gh_property, json_text, markup, text, xml_text

# What the CI systems act on: GitHub runs a line that starts with "::" after leading whitespace; its v1 syntax
# "##[", Azure's "##vso[" and TeamCity's "##teamcity[" are found anywhere in a line.
CI_LINE_START = re.compile(r"^\s*::")
CI_ANYWHERE = re.compile(r"##(\[|vso\[|teamcity\[)")
# Characters XML 1.0 allows (https://www.w3.org/TR/xml/#charsets).
XML_CHAR = re.compile("^[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*$")

hostile = st.text(
    alphabet=st.one_of(
        st.characters(codec=None, exclude_categories=()),  # everything, lone surrogates included
        st.sampled_from([":", "#", "[", "]", "\n", "\r", "\x1b", "%", ",", "\\", "/", "\u202e", "\ufffe", "\udcff"]),
    ),
    max_size=80,
)


def test_injection_payload_from_the_issue() -> None:
    payload = "x\n::error file=a.py,line=1::INJECTED"
    # Shown: x\n:\:error file=a.py,line=1:\:INJECTED -- one line, and no "::" left to start a command.
    assert ci_text(payload) == "x\\n:\\:error file=a.py,line=1:\\:INJECTED"
    assert "::" not in ci_text("\n::stop-commands::token")


def test_control_characters_become_visible_escapes() -> None:
    # ESC ] 8 ;; url BEL is an OSC 8 hyperlink; BEL rings; NUL and DEL are invisible; U+202E reverses the line.
    assert text("a\x1b]8;;http://evil\x07b\x00\x7f\u202e") == "a\\x1b]8;;http://evil\\x07b\\x00\\x7f\\u202e"
    assert text("tab\there\r\n") == "tab\\there\\r\\n"


def test_lone_surrogates_and_undecodable_file_name_bytes() -> None:
    # A YAML "\ud800" escape, and b"\xff" in a file name (held by Python as U+DCFF, PEP 383).
    assert text("a\ud800b\udcffc") == "a\\ud800b\\xffc"
    text("\ud800").encode("utf-8")  # strict UTF-8 accepts the result


@given(hostile)
def test_markup_prints_as_typed_inside_kvplan_markup(value: str) -> None:
    # As render.py uses it: between kvplan's own tags. "[/x]" no longer crashes, "[link=...]" is not a link.
    out = io.StringIO()
    console = Console(file=out, emoji=False, highlight=False, color_system=None, width=10_000)
    console.print(f"[bold]{markup(value)}[/bold]|")
    assert out.getvalue() == ci_text(value) + "|\n"


def test_github_encoding_as_github_documents() -> None:
    # Data: %, CR and LF percent-encoded (a newline stays inside the annotation). Properties: also : and ,.
    assert gh_data("100% full\nsecond line") == "100%25 full%0Asecond line"
    assert gh_property("a:b,c%") == "a%3Ab%2Cc%25"


def test_json_text_keeps_the_data() -> None:
    document = json.dumps({"name": "##vso[task.setvariable variable=x]1 ##[error]"}, indent=2)
    escaped = json_text(document)
    assert "##" not in escaped and json.loads(escaped) == json.loads(document)


@given(hostile)
def test_every_sink_is_one_safe_line(value: str) -> None:
    for sink in (text, ci_text, markup, xml_text):
        out = sink(value)
        out.encode("utf-8")  # no lone surrogate left: a strict UTF-8 stdout cannot fail
        assert "\n" not in out and "\r" not in out and "\x1b" not in out
        assert XML_CHAR.match(out)
    for sink in (ci_text, markup, xml_text, gh_data, gh_property):
        out = sink(value)
        assert not CI_LINE_START.search(out) and not CI_ANYWHERE.search(out) and "::" not in out
    assert "\n" not in gh_data(value) and "\r" not in gh_data(value)
    assert not re.search("[,:\n\r]", gh_property(value))


@given(hostile)
def test_xml_sink_always_parses(value: str) -> None:
    root = ET.Element("testcase", name=xml_text(value))
    root.text = xml_text(value)
    parsed = ET.fromstring(ET.tostring(root, encoding="unicode"))
    assert parsed.get("name") == xml_text(value)


@given(hostile)
def test_json_text_round_trips(value: str) -> None:
    document = json.dumps({"v": value})
    assert json.loads(json_text(document)) == {"v": value}
    assert "##" not in json_text(document)

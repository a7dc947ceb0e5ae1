"""The one place that writes to the terminal: results to stdout, notices and errors to stderr.

The mode (human tables or JSON) is set once per command; commands hand over the data and a renderer and
never branch on the mode themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from kvplan.errors import EXIT_CANNOT_EVALUATE, KvplanError
from kvplan.escape import ci_text, json_text

DEBUG_ENV = "KVPLAN_DEBUG"


def stdout_console() -> Console:
    # emoji=False: a value such as ":warning:" in a model name prints as typed (markup is escaped per value).
    return Console(file=tolerant(sys.stdout), highlight=False, emoji=False, soft_wrap=False, width=_width())


class RstripLines:
    """stdout with the trailing spaces of every line dropped (rich pads help panels and tables to the width):
    a pasted, diffed or CI-logged output carries none. Text is passed on line by line; the rest on close."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        if lines:
            self._stream.write("".join(line.rstrip() + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if self._pending:
            self._stream.write(self._pending.rstrip())
            self._pending = ""
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, encoding, fileno, ...: the real stream's
        return getattr(self._stream, name)


def stderr_console() -> Console:
    return Console(file=tolerant(sys.stderr), highlight=False, emoji=False, soft_wrap=True, width=_width())


def tolerant(stream: Any) -> Any:
    """The stream, set to write what its encoding cannot (an ASCII locale, a strict UTF-8 pipe) as \\u escapes.

    Values are escaped before they are printed (kvplan.escape); this is the last line of defence, so that a
    character no escape foresaw costs a backslash, never the whole output.
    """
    if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (ValueError, OSError):  # a closed or detached stream: leave it as it is
            pass
    return stream


def _width() -> int:
    """COLUMNS when set, else the terminal's width, else 80 (a pipe, a CI log)."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and 20 <= int(columns) <= 1000:
        return int(columns)
    if sys.stdout.isatty():
        return shutil.get_terminal_size((80, 24)).columns
    return 80


@dataclass
class Output:
    json_mode: bool = False

    def result(self, data: dict[str, Any] | list[dict[str, Any]], render: Callable[[Console], None]) -> None:
        """Print a command's result: the JSON document, or the human rendering of the same data."""
        if self.json_mode:
            tolerant(sys.stdout).write(json_text(json.dumps(data, indent=2, sort_keys=False)) + "\n")
            return
        console = stdout_console()
        with console.capture() as captured:
            render(console)
        # Tables pad their last column with spaces; a pasted or diffed report should carry none.
        tolerant(sys.stdout).write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))

    @staticmethod
    def raw(text: str) -> None:
        """Machine text as it is (CSV rows): never wrapped at the terminal's width, no markup."""
        tolerant(sys.stdout).write(text)

    @staticmethod
    def notice(message: str) -> None:
        stderr_console().print(f"Note: {ci_text(message)}", markup=False)

    @staticmethod
    def warn(message: str) -> None:
        stderr_console().print(f"Warning: {ci_text(message)}", markup=False)


def report_error(exc: BaseException) -> int:
    """Print `Error: <one line>` to stderr and return the exit code; the traceback only under KVPLAN_DEBUG."""
    debug = os.environ.get(DEBUG_ENV, "").strip() not in ("", "0")
    if isinstance(exc, KvplanError):
        message, code = exc.message, exc.exit_code
    else:
        message = f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}"
        if not debug:
            message += f" (set {DEBUG_ENV}=1 to see the traceback)"
        code = EXIT_CANNOT_EVALUATE
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    tolerant(sys.stderr).write(f"Error: {ci_text(message)}\n")
    return code

"""Read a local file that an untrusted name points at: regular files only, never blocking, size-capped, in chunks.

`kvplan estimate /dev/zero` would otherwise grow until MemoryError, a FIFO named `config.json` or `deploy.yaml`
would block the open for ever, and a 1 GB file would be held twice (bytes, then text). Here the file is checked
with stat before it is opened (opening some devices has side effects), opened with O_NONBLOCK (a FIFO that
appeared in between returns at once), checked again with fstat, and read 64 KiB at a time until the cap.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from kvplan.units import MiB

MAX_CONFIG_BYTES = 8 * MiB  # the largest config.json in the library is 0.3 MB; 8 MiB leaves room for generated ones
_CHUNK_BYTES = 64 * 1024
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


class Refused(Exception):
    """A file kvplan will not read, and why: one line that does not repeat the path."""


def read_regular(path: str | os.PathLike[str], max_bytes: int, what: str = "files") -> bytes:
    """The bytes of a regular file of at most `max_bytes`; Refused for anything else, without blocking.

    `what` names the files in the size message: "kvplan reads deployment files of up to 5 MiB".
    """
    try:
        _check_kind(os.stat(path).st_mode)
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise Refused(_os_reason(exc)) from None
    except ValueError as exc:  # an embedded NUL byte, or a lone surrogate the file system cannot encode
        raise Refused(f"not a usable path ({exc})") from None
    try:
        info = os.fstat(fd)
        _check_kind(info.st_mode)
        if info.st_size > max_bytes:
            raise Refused(f"is {info.st_size:,} bytes; kvplan reads {what} of up to {_size(max_bytes)}")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(_CHUNK_BYTES, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:  # it grew while being read
            raise Refused(f"holds more than {_size(max_bytes)}; kvplan reads {what} of up to that")
        return b"".join(chunks)
    except OSError as exc:
        raise Refused(_os_reason(exc)) from None
    finally:
        os.close(fd)


def json_object(data: bytes) -> dict[str, Any]:
    """A JSON object from bytes, or Refused naming what is wrong (json accepts the Infinity/NaN configs hold)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Refused(f"is not UTF-8 text (byte {exc.start:,} is 0x{data[exc.start]:02x})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise Refused(f"is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise Refused("nests its JSON deeper than kvplan reads (a corrupt or hostile file)") from None
    except ValueError:  # the only other ValueError json raises: an integer beyond Python's 4,300-digit limit
        raise Refused("holds a number of more than 4,300 digits (a corrupt or hostile file)") from None
    if not isinstance(value, dict):
        raise Refused(f"must hold a JSON object, not a {type(value).__name__}")
    return value


def _size(n_bytes: int) -> str:
    return f"{n_bytes // MiB} MiB" if n_bytes % MiB == 0 else f"{n_bytes:,} bytes"


def _check_kind(mode: int) -> None:
    for test, kind in _KINDS:
        if test(mode):
            raise Refused(f"is {kind}, not a regular file")
    if not stat.S_ISREG(mode):
        raise Refused("is not a regular file")


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "the path is longer than the file system allows (ENAMETOOLONG)"
    return f"cannot be read: {exc.strerror or exc}"

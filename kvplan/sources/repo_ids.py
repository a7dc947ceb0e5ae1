"""What an `org/name` Hub repo id looks like, without importing the Hub client (the resolver asks on every run)."""

from __future__ import annotations

import re
from pathlib import Path

# An `org/name` repo id as the Hub accepts it: each part starts and ends with a letter or digit, at most 96
# characters, no "--" or ".." (the Hub reserves those).
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?/[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_REPO_ID_MAX_CHARS = 96


def is_repo_id(text: str) -> bool:
    """True for text spelled as an `org/name` Hub repo id ("meta-llama/Llama-2-7b"), without looking at files."""
    if len(text) > _REPO_ID_MAX_CHARS or not _REPO_ID_RE.match(text) or "--" in text or ".." in text:
        return False
    # "models/config.json" is a mistyped path far more often than a repo named *.json.
    return not text.endswith(".json")


def looks_like_repo_id(text: str) -> bool:
    """True for an `org/name` Hub repo id that is not an existing local path."""
    return is_repo_id(text) and not Path(text).expanduser().exists()

"""Engine release numbers as the engines print them, read into comparable (major, minor, patch) triples.

`0.5.13.post1`, `0.16.1rc1.dev206+g097eb544e` and `v0.4.3` all name a release line; a pre-release or a
development build is taken as the release it leads to (0.16.1rc1 follows 0.16.1's rules), which is what its
source tree holds. "current" means the newest release an engine model knows.
"""

from __future__ import annotations

import re

Release = tuple[int, int, int]

CURRENT = "current"
_RELEASE = re.compile(r"^v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?(?:[.+-]?[A-Za-z0-9.+-]*)?$")


def parse_release(text: str) -> Release | None:
    """(major, minor, patch) of a release string, None when it is not one: "0.5.13.post1" -> (0, 5, 13)."""
    m = _RELEASE.match(str(text).strip())
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def release_text(release: Release) -> str:
    return ".".join(map(str, release))

"""The SGLang releases niah's plugin is proven on, and which one a version string is.

    SUPPORTED_VERSIONS: the releases, oldest first; each has its own rows in the patch
        tables (a row names the releases it holds for, none: all) and its own call sites,
        key flows and layout constants in the contract.
    release_of(version) -> the supported release a version is a build of (0.5.23,
        0.5.23.post1, 0.5.23+cu130 -> "0.5.23"), or None (another release, rc/dev, garbage).

Imports nothing of SGLang, torch or the rest of niah.
"""

from __future__ import annotations

import re

SUPPORTED_VERSIONS = ("0.5.16", "0.5.23")
NEWEST = SUPPORTED_VERSIONS[-1]
VERSION_RE = re.compile(r"^(\d+\.\d+\.\d+)(\.post\d+)?(\+[A-Za-z0-9.]+)?$")


def release_of(version: str | None) -> str | None:
    """The supported release `version` is a build of, or None."""
    m = VERSION_RE.match(version or "")
    return m.group(1) if m and m.group(1) in SUPPORTED_VERSIONS else None


def check_release(release: str) -> str:
    """`release` itself when supported; ValueError otherwise (a table or caller typo)."""
    if release not in SUPPORTED_VERSIONS:
        raise ValueError(f"SGLang {release} is not a supported release ({', '.join(SUPPORTED_VERSIONS)})")
    return release

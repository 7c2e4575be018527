"""The plugin's tables: one per model family, each row an SGLang symbol (`PatchPoint`) with
what the plugin installs there per arm (`Replacement`) and the SGLang releases it holds for.
Adding a patched symbol is one row (or one `replacements=` on its row); a symbol that differs
between releases has one row per release; adding a family is one module and one entry in
`FAMILY_POINTS`.

The contract check (niah.serving.sglang.contract) reads the points of the installed
release, the plugin (niah.serving.sglang.plugin) installs `patches_for(arm, release)`.
Every function here takes the release (niah.serving.sglang.releases: a supported one;
default the newest). Importing this package imports neither SGLang nor torch
(replacements are resolved when installed).
"""

from __future__ import annotations

from niah.serving.sglang.arms import default_kernels
from niah.serving.sglang.patches.deepseek_v4 import V4_POINTS
from niah.serving.sglang.patches.deepseek_v32 import V32_POINTS
from niah.serving.sglang.patches.point import Patch, PatchPoint, Replacement, for_releases, put, wrap
from niah.serving.sglang.patches.server import SERVER_POINTS
from niah.serving.sglang.releases import NEWEST, SUPPORTED_VERSIONS, check_release

__all__ = ["FAMILY_POINTS", "PATCH_POINTS", "Patch", "PatchPoint", "Replacement", "SERVER_POINTS", "V32_POINTS",
           "V4_POINTS", "all_patches", "for_releases", "patch_targets", "patches_for", "points_for", "points_of",
           "put", "wrap"]

FAMILY_POINTS: dict[str, tuple[PatchPoint, ...]] = {
    "server": SERVER_POINTS, "deepseek-v3.2": V32_POINTS, "deepseek-v4": V4_POINTS}
PATCH_POINTS: tuple[PatchPoint, ...] = tuple(p for pts in FAMILY_POINTS.values() for p in pts)  # every release's


def _check_tables() -> None:
    """A row replaces or wraps exactly when it carries replacements; a row names only
    supported releases; no symbol has two rows for one release (import-time: a table typo
    must not reach a server)."""
    for p in PATCH_POINTS:
        if (p.action in ("replace", "wrap")) != bool(p.replacements):
            raise AssertionError(f"{p.target}: action {p.action!r} with {len(p.replacements)} replacement(s)")
        for v in p.versions:
            check_release(v)
    for release in SUPPORTED_VERSIONS:
        targets = [p.target for p in PATCH_POINTS if p.holds_for(release)]
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise AssertionError(f"sglang {release}: more than one row for {', '.join(twice)}")


_check_tables()


def points_of(release: str = NEWEST) -> tuple[PatchPoint, ...]:
    """Every row that is the contract for `release`."""
    check_release(release)
    return tuple(p for p in PATCH_POINTS if p.holds_for(release))


def points_for(index_dtype: str, kernels: str | None = None, release: str = NEWEST) -> tuple[PatchPoint, ...]:
    """The patch points needed for one arm: index dtype "fp8" / "bf16", kernels "stock" /
    "niah" (None: both kernels), on one release."""
    wanted = {"always", index_dtype, *((kernels,) if kernels else ("stock", "niah"))}
    return tuple(p for p in points_of(release) if p.when in wanted)


def all_patches(release: str = NEWEST) -> list[Patch]:
    """Every replacement of every table row for `release`, bound to its point."""
    return [Patch(p, r) for p in points_of(release) for r in p.replacements]


def patches_for(index_dtype: str, kernels: str, release: str = NEWEST) -> list[Patch]:
    """The patches installed for one arm on one release."""
    return [p for p in all_patches(release) if p.when in ("always", index_dtype, kernels)]


def patch_targets(index_dtype: str, kernels: str | None = None, release: str = NEWEST) -> list[str]:
    """The targets patched for one arm (for docs, doctor and tests)."""
    return [p.target for p in patches_for(index_dtype, kernels or default_kernels(index_dtype), release)]

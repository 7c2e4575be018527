"""The plugin's tables: one per model family, each row an SGLang symbol (`PatchPoint`) with
what the plugin installs there per arm (`Replacement`). Adding a patched symbol is one row
(or one `replacements=` on its row); adding a family is one module and one entry in
`FAMILY_POINTS`.

The contract check (niah.serving.sglang.contract) reads the points, the plugin
(niah.serving.sglang.plugin) installs `patches_for(arm)`. Importing this package imports
neither SGLang nor torch (replacements are resolved when installed).
"""

from __future__ import annotations

from niah.serving.sglang.arms import default_kernels
from niah.serving.sglang.patches.deepseek_v4 import V4_POINTS
from niah.serving.sglang.patches.deepseek_v32 import V32_POINTS
from niah.serving.sglang.patches.point import Patch, PatchPoint, Replacement, put, wrap
from niah.serving.sglang.patches.server import SERVER_POINTS

__all__ = ["FAMILY_POINTS", "PATCH_POINTS", "Patch", "PatchPoint", "Replacement", "SERVER_POINTS", "V32_POINTS",
           "V4_POINTS", "all_patches", "patch_targets", "patches_for", "points_for", "put", "wrap"]

FAMILY_POINTS: dict[str, tuple[PatchPoint, ...]] = {
    "server": SERVER_POINTS, "deepseek-v3.2": V32_POINTS, "deepseek-v4": V4_POINTS}
PATCH_POINTS: tuple[PatchPoint, ...] = tuple(p for pts in FAMILY_POINTS.values() for p in pts)


def _check_tables() -> None:
    """A row replaces or wraps exactly when it carries replacements (import-time: a table typo
    must not reach a server)."""
    for p in PATCH_POINTS:
        if (p.action in ("replace", "wrap")) != bool(p.replacements):
            raise AssertionError(f"{p.target}: action {p.action!r} with {len(p.replacements)} replacement(s)")


_check_tables()


def points_for(index_dtype: str, kernels: str | None = None) -> tuple[PatchPoint, ...]:
    """The patch points needed for one arm: index dtype "fp8" / "bf16", kernels "stock" /
    "niah" (None: both kernels)."""
    wanted = {"always", index_dtype, *((kernels,) if kernels else ("stock", "niah"))}
    return tuple(p for p in PATCH_POINTS if p.when in wanted)


def all_patches() -> list[Patch]:
    """Every replacement of every table, bound to its point."""
    return [Patch(p, r) for p in PATCH_POINTS for r in p.replacements]


def patches_for(index_dtype: str, kernels: str) -> list[Patch]:
    """The patches installed for one arm."""
    return [p for p in all_patches() if p.when in ("always", index_dtype, kernels)]


def patch_targets(index_dtype: str, kernels: str | None = None) -> list[str]:
    """The targets patched for one arm (for docs, doctor and tests)."""
    return [p.target for p in patches_for(index_dtype, kernels or default_kernels(index_dtype))]

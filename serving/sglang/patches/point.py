"""One row of the plugin's tables: an SGLang symbol the plugin touches (`PatchPoint`) and,
for the ones it replaces or wraps, what it puts there per arm (`Replacement`).

A replacement names its function as "module.name" inside niah.serving.sglang and is
resolved only when the plugin installs it, so reading the tables imports neither torch
nor SGLang. `Patch` is one replacement bound to its point: what the plugin applies.

A row holds for every supported SGLang release unless `versions` names the ones it holds
for; where a release differs, the table has one row per release for that symbol
(`for_releases` derives one from another, changing only what differs), and at most one
row per symbol holds for any release (patches/__init__.py checks it at import).
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable

REPLACEMENTS_PACKAGE = "niah.serving.sglang"


@dataclass(frozen=True)
class Replacement:
    """What goes in a point's place when `when` ("always", an index dtype or a kernels value)
    matches the arm: `ref` itself (wraps False), or `ref(original)` (wraps True; with
    `args`, `ref(*args)` is the function that takes the original)."""

    when: str
    ref: str
    wraps: bool = False
    args: tuple = ()

    def resolve(self) -> Callable:
        module, _, name = self.ref.rpartition(".")
        return getattr(importlib.import_module(f"{REPLACEMENTS_PACKAGE}.{module}"), name)


def put(when: str, ref: str) -> Replacement:
    """Replace the symbol by `ref` (same signature) in arms matching `when`."""
    return Replacement(when, ref)


def wrap(when: str, ref: str, *args) -> Replacement:
    """Install `ref(original)` (or `ref(*args)(original)`) in arms matching `when`."""
    return Replacement(when, ref, wraps=True, args=tuple(args))


@dataclass(frozen=True)
class PatchPoint:
    """One symbol the plugin touches.

    module: dotted module path; qualname: `func` or `Class.method`;
    params: the expected parameter names in order (None: only existence is checked);
    action: what the plugin does with it ("replace", "wrap", "uses");
    when: the arms whose contract needs it ("always", "fp8", "bf16", "niah", "stock");
    why: one line for docs and error messages;
    references: names (identifiers or attribute names) the body must mention;
    replacements: what the plugin installs there, per arm (empty for "uses");
    versions: the SGLang releases this row holds for (empty: every supported release).
    """

    module: str
    qualname: str
    params: tuple[str, ...] | None
    action: str
    when: str
    why: str
    references: tuple[str, ...] = ()
    replacements: tuple[Replacement, ...] = ()
    versions: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return f"{self.module}.{self.qualname}"

    def holds_for(self, release: str | None) -> bool:
        """Whether this row is the contract for `release` (None: any release)."""
        return release is None or not self.versions or release in self.versions


def for_releases(versions: tuple[str, ...], point: PatchPoint, **changes) -> PatchPoint:
    """`point` restricted to `versions`, with `changes` (params, references, why, ...)."""
    return dataclasses.replace(point, versions=tuple(versions), **changes)


@dataclass(frozen=True)
class Patch:
    """One replacement bound to its point: the plugin installs `factory(original)` at
    `point` in the arms `when` names."""

    point: PatchPoint
    replacement: Replacement

    @property
    def target(self) -> str:
        return self.point.target

    @property
    def when(self) -> str:
        return self.replacement.when

    @property
    def factory(self) -> Callable:
        r = self.replacement
        fn = r.resolve()
        if not r.wraps:
            return lambda original: fn
        return fn(*r.args) if r.args else fn

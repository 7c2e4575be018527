"""What tells configurations apart: axis names, their defaults, and the label keys.

An axis is a key a matrix may cross in `[axes]` (serving/matrix); a configuration that
sets one itself records it as its manifest `axes`. `AXIS_NAMES` says how each value
shows in a configuration's name, `AXIS_DEFAULTS` what a server runs for an axis key its
configuration leaves unset, and `comparable_axes` completes two configurations' axes so
reports (niah.report) and the matrix's dry run pair the arms one factor apart.
`LABEL_KEYS` are the labels an attestation must back (niah.attestation). Pure data and
pure functions; imports nothing of niah.
"""

from __future__ import annotations

from typing import Any, Callable

# Keys that may be crossed in [axes], and how each shows in a configuration's name.
AXIS_NAMES: dict[str, Callable[[Any], str]] = {
    "index_dtype": lambda v: v.replace("+", "-"),    # two-stage "fp8+bf16" -> "fp8-bf16"
    "index_rotation": lambda v: "norot" if v == "none" else f"{v}",
    "index_query_dtype": lambda v: f"q{v}",
    "rescore_factor": lambda v: f"c{v}",
    "kernels": lambda v: f"{v}",
    "index_topk": lambda v: f"k{v}",
    "attention": lambda v: f"{v}",
    "window": lambda v: f"w{v}",
    "tp": lambda v: f"tp{v}",
}
# Keys recorded as a configuration's `axes` in the manifest when it sets them itself.
AXIS_KEYS = tuple(AXIS_NAMES)
# What a server runs for an axis key its configuration leaves unset (so a `[[config]]`
# with index_rotation = "hadamard" pairs with the [axes] arm it rotates; comparable_axes).
AXIS_DEFAULTS: dict[str, Any] = {"index_rotation": "none"}
# The labels a configuration may state that its server's attestation must back.
# index_query_dtype is attested by the fact `query`, rescore_factor by the fact of its name.
# The serving paths (PATH_KEYS) by the facts of their names; a server that states one as
# null ran without it (a one-pass prefill, a flat index cache).
PATH_KEYS = ("page_size", "prefill_chunk", "prefix_cache", "index_compress")
LABEL_KEYS = ("attention", "index_dtype", "kernels", "index_rotation", "index_query_dtype", "rescore_factor",
              "index_topk", "window", *PATH_KEYS)


def comparable_axes(a: dict[str, Any], b: dict[str, Any], settings_a: dict[str, Any] | None = None,
                    settings_b: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two configurations' axes, each completed with the axis keys only the other one has:
    the value from its own settings (a top-level default of the file), else AXIS_DEFAULTS.
    A key neither gives stays missing (the two are then not one axis apart)."""
    def complete(axes: dict[str, Any], other: dict[str, Any], settings: dict[str, Any] | None) -> dict[str, Any]:
        out = dict(axes)
        for k in other:
            if k not in out and k in (settings or {}):
                out[k] = settings[k]
            elif k not in out and k in AXIS_DEFAULTS:
                out[k] = AXIS_DEFAULTS[k]
        return out

    return complete(a, b, settings_a), complete(b, a, settings_b)


def stated_labels(entry: dict) -> dict:
    """The label keys a manifest `configs.<name>` entry states (its settings, then its axes)."""
    merged = {**(entry.get("settings") or {}), **(entry.get("axes") or {})}
    return {k: merged[k] for k in LABEL_KEYS if k in merged}

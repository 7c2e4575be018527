"""The caller tables per SGLang release: 0.5.23's call sites (call_sites.py) and key flows
(flow_sites.py), and for 0.5.16 the same with its own rows (sites_0516.py) in place of every
0.5.23 row for the same (file, function, callee).

    call_sites(release) -> {(file, function, callee, count): disposition}
    call_counts(release) -> {(file, function, callee): count}
    known_flows(release) -> {(file, function, callee, conditions): count}

A release that is not supported is a ValueError (releases.check_release).
"""

from __future__ import annotations

import functools

from niah.serving.sglang.contract.call_sites import SITES
from niah.serving.sglang.contract.flow_sites import FLOWS
from niah.serving.sglang.contract.sites_0516 import FLOWS_0516, SITES_0516
from niah.serving.sglang.releases import NEWEST, check_release

_OWN_ROWS = {"0.5.16": (SITES_0516, FLOWS_0516)}


def _merged(base: dict[str, list[tuple]], own: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    """base with `own`'s rows in place of every base row for the same (file, function, callee)."""
    replaced = {(f, row[0], row[1]) for f, rows in own.items() for row in rows}
    out = {f: [r for r in rows if (f, r[0], r[1]) not in replaced] for f, rows in base.items()}
    for f, rows in own.items():
        out.setdefault(f, []).extend(rows)
    return out


@functools.cache
def call_sites(release: str = NEWEST) -> dict[tuple[str, str, str, int], str]:
    """(file, enclosing function, callee, count) -> disposition, for every known site of `release`."""
    sites = _merged(SITES, _OWN_ROWS[release][0]) if check_release(release) in _OWN_ROWS else SITES
    return {(f, where, callee, n): why for f, rows in sites.items() for where, callee, n, why in rows}


@functools.cache
def call_counts(release: str = NEWEST) -> dict[tuple[str, str, str], int]:
    """(file, enclosing function, callee) -> how many times the contract says it is called."""
    return {(f, where, callee): n for (f, where, callee, n) in call_sites(release)}


@functools.cache
def known_flows(release: str = NEWEST) -> dict[tuple[str, str, str, str], int]:
    """(file, function, callee, conditions) -> count, for every known flow of `release`."""
    flows = _merged(FLOWS, _OWN_ROWS[release][1]) if check_release(release) in _OWN_ROWS else FLOWS
    return {(f, where, callee, guard): n for f, rows in flows.items() for where, callee, guard, n in rows}

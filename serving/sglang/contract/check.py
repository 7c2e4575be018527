"""The check: every patch point against a source, then (for the plugin's own points) the
layout constants, the call sites and the data flows of SGLang's index keys. Collects every
problem; each names the file and line where SGLang's source says so.

A source must say which SGLang it is: a supported release or a build of one (0.5.16, 0.5.23,
0.5.23.post1, 0.5.23+cu130; a build only on its own source passing), never an unknown
version (a tree without dist-info METADATA is refused, not "OK"). Each release is checked
against its own rows (patches.points_of, tables.py, layout.layout_of); a version that is no
supported release is refused up front with one line, nothing else checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from niah.serving.sglang.contract.flows import check_flows
from niah.serving.sglang.contract.layout import check_layout, layout_of
from niah.serving.sglang.contract.sites import check_call_sites
from niah.serving.sglang.contract.sources import SymbolSource
from niah.serving.sglang.contract.tables import call_sites, known_flows
from niah.serving.sglang.patches import PATCH_POINTS, PatchPoint, points_of
from niah.serving.sglang.releases import SUPPORTED_VERSIONS, release_of


def supported_version(version: str) -> bool:
    """Any build of a supported release: 0.5.16, 0.5.23, 0.5.23.post1, 0.5.23+cu130 (not rc/dev)."""
    return release_of(version) is not None


@dataclass
class ContractReport:
    version: str | None
    source: str
    checked: int = 0
    problems: list[str] = field(default_factory=list)
    extra: str = ""  # what else was checked (layout constants, call sites, key flows)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def build_note(self) -> str | None:
        """For a post release or local build of a supported version (0.5.23.post1,
        0.5.23+cu130): that it is accepted only because its own source passed the check."""
        v = self.version or ""
        if v in SUPPORTED_VERSIONS or not supported_version(v):
            return None
        base = release_of(v)
        if self.ok:
            return (f"{v} is a build of {base}, not the {base} release: accepted only because its own source "
                    "passes the same contract check (patch points, call sites, layout constants)")
        return f"{v} is a build of {base}: not accepted, its source fails the contract check"

    def summary(self) -> str:
        v = self.version or "unknown version"
        if self.ok:
            return f"plugin contract OK: sglang {v} ({self.checked} patch points{self.extra}, {self.source})"
        head = (f"niah's SGLang plugin does not fit sglang {v} ({self.source}): "
                f"{'; '.join(self.problems)}. Supported SGLang versions: "
                f"{', '.join(SUPPORTED_VERSIONS)}")
        return head


def check_contract(source: SymbolSource, points: Iterable[PatchPoint] | None = None,
                   callers: bool | None = None) -> ContractReport:
    """Check the patch points of the source's release (or `points`, those of them that hold
    for it) against `source`, then (for the plugin's own points, or when `callers` is True)
    that release's layout constants, every call site of the index-key pool and indexer
    kernels (sites.py) and every flow of the keys (flows.py). Collects every problem; each
    names the file and line where SGLang's source says so. A source of no supported release
    gets one problem and nothing else is checked."""
    report = ContractReport(version=source.version, source=source.label)
    if source.version is None:
        report.problems.append(f"{source.label}: no SGLang version metadata (no sglang-*.dist-info/METADATA with a "
                               "Version), so it cannot be told which SGLang this is")
        return report
    release = release_of(source.version)
    if release is None:
        report.problems.append(f"version {source.version} is not a supported version")
        return report
    points = list(points_of(release) if points is None else (p for p in points if p.holds_for(release)))
    _check_points(source, points, report)
    if callers if callers is not None else all(p in PATCH_POINTS for p in points):
        files = source.files()
        report.problems += check_layout(source, files, release)
        report.problems += check_call_sites(files, release)
        report.problems += check_flows(files, release)
        report.extra = (f", {len(layout_of(release))} layout constants, {len(call_sites(release))} call sites, "
                        f"{len(known_flows(release))} key flows in {len(files)} files scanned")
    return report


def _check_points(source: SymbolSource, points: list[PatchPoint], report: ContractReport) -> None:
    for p in points:
        report.checked += 1
        sym = source.lookup(p.module, p.qualname)
        if sym is None:
            report.problems.append(f"{source.near(p.module, p.qualname)}: missing symbol {p.target} ({p.why})")
            continue
        at = f"{sym.where}: " if sym.where else ""
        if p.params is not None and sym.params != p.params:
            got = "not a function" if sym.params is None else f"({', '.join(sym.params)})"
            report.problems.append(
                f"{at}signature changed: {p.target} expected ({', '.join(p.params)}), found {got}")
        missing_refs = [r for r in p.references if r not in sym.names]
        if missing_refs:
            report.problems.append(
                f"{at}{p.target} no longer references {', '.join(missing_refs)} ({p.why})")

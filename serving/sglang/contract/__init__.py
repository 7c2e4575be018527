"""The plugin's contract with SGLang and the one function that checks it.

Every symbol the plugin replaces, wraps or relies on is a `PatchPoint` (the tables in
niah.serving.sglang.patches): the module, the qualified name inside it, the parameter
names it must have (in order, keyword-only ones included), and names its body must
still reference. `check_contract` (check.py) runs them against a `SymbolSource`
(sources.py: SGLang's source read as AST from the wheel, an unpacked tree or the installed
package's folder; SGLang is never imported), then checks SGLang's callers: the layout
constants (layout.py), the call sites of the index-key pool and indexer kernels (sites.py,
with their dispositions in call_sites.py) and the data flows of the keys (flows.py, known
flows in flow_sites.py). The plugin refuses to start unless the check passes; it runs the
same check, on the installed package's folder (InstalledSource), that the tests run on
each release's wheel.

Imports neither SGLang nor torch.
"""

from niah.serving.sglang.contract.check import (
    SUPPORTED_VERSIONS, ContractReport, check_contract, supported_version)
from niah.serving.sglang.contract.layout import LAYOUT, LayoutConstant
from niah.serving.sglang.contract.sources import AstSource, InstalledSource, Symbol, SymbolSource
from niah.serving.sglang.patches import (
    FAMILY_POINTS, PATCH_POINTS, SERVER_POINTS, V4_POINTS, V32_POINTS, PatchPoint, points_for)

__all__ = ["FAMILY_POINTS", "LAYOUT", "PATCH_POINTS", "SERVER_POINTS", "SUPPORTED_VERSIONS", "V32_POINTS",
           "V4_POINTS", "AstSource", "ContractReport", "InstalledSource", "LayoutConstant",
           "PatchPoint", "Symbol", "SymbolSource", "check_contract", "points_for", "supported_version"]

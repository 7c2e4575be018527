"""Putting one function in an SGLang symbol's place, in a live process.

`apply_at(module, qualname, factory)` replaces `module.qualname` by `factory(original)`,
keeps staticmethod / classmethod, rebinds every `from module import name` copy in the
loaded modules and never patches twice; a copy that cannot be rebound is PluginRefused
(one line): that module would still call SGLang's original. The plugin (plugin.py) and
the V4 routing of DeepGEMM's functions (v4.route_deep_gemm) use it; `installed_arm()`
is the arm the plugin installed in this process.
"""

from __future__ import annotations

import importlib
import logging
import sys
import types
from typing import Callable

from niah.errors import BadInput

log = logging.getLogger("niah.sglang")

_installed: tuple[str, str] | None = None


class PluginRefused(BadInput):
    """The installed SGLang does not match what the plugin patches, or patching failed."""


def installed_arm() -> tuple[str, str] | None:
    """(index dtype, kernels) the plugin was installed with in this process (None: not installed)."""
    return _installed


def set_installed(arm: tuple[str, str]) -> None:
    global _installed
    _installed = arm


def _propagate(original, new, skip, target: str) -> None:
    """Rebind `from X import name` copies of `original` in every loaded module. A copy
    that cannot be rebound would keep calling SGLang's original: PluginRefused."""
    for mod in list(sys.modules.values()):
        if mod is None or mod is skip or not isinstance(mod, types.ModuleType):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for name, value in items:
            if value is original:
                try:
                    setattr(mod, name, new)
                except Exception as e:
                    raise PluginRefused(
                        f"cannot patch {target}: its copy {getattr(mod, '__name__', mod)}.{name} cannot be "
                        f"rebound ({type(e).__name__}: {e}), so that module would still call SGLang's original"
                    ) from None


def apply_at(module: str, qualname: str, factory: Callable) -> None:
    """Replace `module.qualname` by `factory(original)`: keeps staticmethod/classmethod,
    rebinds `from module import name` copies elsewhere, and never patches twice."""
    target = f"{module}.{qualname}"
    parts = qualname.split(".")
    owner = importlib.import_module(module)
    for part in parts[:-1]:
        owner = getattr(owner, part)
    name = parts[-1]
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None:
        raise PluginRefused(f"{target} vanished between the contract check and patching")
    original = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if getattr(original, "__niah__", False):
        return
    new = factory(original)
    new.__niah__ = True
    if isinstance(raw, staticmethod):
        new = staticmethod(new)
    elif isinstance(raw, classmethod):
        new = classmethod(new)
    setattr(owner, name, new)
    if not isinstance(owner, type):
        _propagate(original, new, owner, target)
    log.info("niah: patched %s", target)

"""Install niah's patches into a live SGLang process.

SGLang (0.5.16 and 0.5.23, the releases niah supports) runs entry-point
plugins (group `sglang.srt.plugins`) in every process
it starts, the spawned scheduler/model processes included; niah registers
`sglang_plugin` there (pyproject.toml). It does nothing unless NIAH_INDEX_DTYPE is
set, which the launch entry (`python -m niah.serving.sglang`) does, with NIAH_KERNELS.
Before patching anything it checks the contract of the installed release against the
installed package's source (`check_installed`: the same AST check the tests run on each
release's wheel; nothing of SGLang imported) and refuses, naming the version and the
symbol, if SGLang does not match (an SGLang that is no supported release: one line,
nothing patched); it then installs that release's rows, importing each patched module as
it patches it. Any failure while patching stops the process with one line naming the
symbol (fail closed).

Arms (index dtype / kernels): fp8/niah (SGLang's fp8 keys read by niah's fp8 logits
kernels), bf16/niah (niah's bf16 index keys and kernels). fp8/stock is SGLang alone: niah's
launcher starts plain `sglang.launch_server` without NIAH_* variables, so the plugin does
not run there (installing it for fp8/stock by hand only counts calls). In every arm SGLang
keeps its fused indexer, prefill CUDA graphs, its fp8 query and its own top-k. What is
patched is the tables' data (niah.serving.sglang.patches: one row per symbol, with its
replacement per arm); patching.py puts each in place.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import entry_points

from niah.errors import BadInput
from niah.serving.sglang import attest
from niah.serving.sglang.arms import (  # noqa: F401  (re-exported: the plugin's arms)
    ENTRY_POINT_GROUP, ENTRY_POINT_NAME, ENV_INDEX_DTYPE, ENV_KERNELS, KERNELS, check_arm, default_kernels,
    plugin_dtypes)
from niah.serving.sglang.contract import ContractReport, InstalledSource, check_contract, points_for
from niah.serving.sglang.patches import Patch, all_patches, patch_targets, patches_for  # noqa: F401
from niah.serving.sglang.patching import PluginRefused, apply_at, installed_arm, set_installed  # noqa: F401
from niah.serving.sglang.releases import NEWEST, SUPPORTED_VERSIONS, release_of

log = logging.getLogger("niah.sglang")


def apply_all(patches: list[Patch]) -> None:
    """Apply every patch; the first failure of any kind becomes PluginRefused naming it."""
    for p in patches:
        try:
            apply_at(p.point.module, p.point.qualname, p.factory)
        except PluginRefused:
            raise
        except Exception as e:  # fail closed: a half-patched server must not serve
            raise PluginRefused(f"patching {p.target} failed: {type(e).__name__}: {e}") from e


def install(index_dtype: str, kernels: str | None = None) -> None:
    """Check the contract against the installed SGLang, then patch. Idempotent."""
    kernels = kernels or default_kernels(index_dtype)
    check_arm(index_dtype, kernels)
    installed = installed_arm()
    if installed == (index_dtype, kernels):
        return
    if installed is not None:
        raise BadInput(f"niah plugin already installed as {'/'.join(installed)}")
    release, report = check_installed(index_dtype, kernels)
    if report.build_note:
        log.info("niah: %s", report.build_note)
    attest.configure(index_dtype, kernels)
    attest.set_facts(query="fp8")  # SGLang's own fp8 indexer query in every arm (bf16 kernels: upcast, exact)
    apply_all(patches_for(index_dtype, kernels, release))
    set_installed((index_dtype, kernels))
    log.info("niah: SGLang plugin installed (sglang %s, %s/%s)", report.version, index_dtype, kernels)


def check_installed(index_dtype: str, kernels: str) -> tuple[str, ContractReport]:
    """The contract check `install` runs before patching: the installed SGLang's source
    (InstalledSource, nothing imported) against its own release's rows for this arm.
    Returns (release, passing report); PluginRefused (one line) otherwise."""
    source = InstalledSource()
    if source.version is None:
        raise PluginRefused(f"SGLang is not installed in this environment (pip install sglang=={NEWEST})")
    release = release_of(source.version)
    if release is None:
        raise PluginRefused(f"sglang {source.version} is not a release niah's plugin is proven on "
                            f"(supported: {', '.join(SUPPORTED_VERSIONS)})")
    try:
        report = check_contract(source, points_for(index_dtype, kernels, release))
    except Exception as e:
        raise PluginRefused(f"contract check failed: {type(e).__name__}: {e}") from e
    if not report.ok:
        raise PluginRefused(report.summary())
    return release, report


def sglang_plugin() -> None:
    """Entry point for SGLang's plugin loader: install iff NIAH_INDEX_DTYPE is set.

    SGLang logs and swallows plugin exceptions, so any failure here is printed as one
    line and the process exits (code 2) before the model loads: serving with half a
    plugin would give wrong recall numbers.
    """
    dtype = os.environ.get(ENV_INDEX_DTYPE)
    if not dtype:
        return
    try:
        install(dtype, os.environ.get(ENV_KERNELS) or None)
    except Exception as e:
        msg = str(e) if isinstance(e, BadInput) else f"{type(e).__name__}: {e}"
        print(f"niah: error: {msg}".splitlines()[0], file=sys.stderr, flush=True)
        os._exit(2)


def entry_point_registered() -> bool:
    """Whether SGLang's loader will find this plugin (niah pip-installed in this env)."""
    return any(ep.name == ENTRY_POINT_NAME and ep.value.startswith("niah.serving.sglang")
               for ep in entry_points(group=ENTRY_POINT_GROUP))

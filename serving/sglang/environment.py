"""Facts about this environment for `niah doctor`: SGLang, the plugin contract, torch,
Triton, CUDA and GPUs. Each probe reports a failure as text rather than raising."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from niah.serving.sglang.contract import SUPPORTED_VERSIONS, AstSource, InstalledSource, check_contract, points_for
from niah.serving.sglang.patches import points_of
from niah.serving.sglang.releases import NEWEST, release_of
from niah.serving.sglang.kernels_api import available
from niah.serving.sglang.plugin import entry_point_registered


@dataclass
class Facts:
    rows: list[tuple[str, str]] = field(default_factory=list)
    contract_ok: bool | None = None  # None: nothing to check against
    release: str | None = None  # the supported release the checked source is a build of (None: none)

    def add(self, key: str, value: str) -> None:
        self.rows.append((key, value))


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def default_wheel() -> Path | None:
    """The newest supported release's SGLang source wheel `make setup` downloads, if present."""
    cache = Path(os.environ.get("SGLANG_SRC_CACHE") or Path(__file__).resolve().parents[2] / ".cache" / "sglang")
    wheels = sorted(cache.glob(f"sglang-{NEWEST}-*.whl")) if cache.is_dir() else []
    return wheels[-1] if wheels else None


def torch_facts(f: Facts) -> None:
    try:
        import torch
    except ImportError:
        f.add("torch", "not installed")
        return
    f.add("torch", torch.__version__)
    f.add("torch CUDA build", torch.version.cuda or "none (CPU build)")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            f.add(f"GPU {i}",
                  f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs")
    else:
        f.add("GPUs", "none visible to torch")
    tv = _version("triton")
    f.add("triton", tv or "not installed")


def contract_facts(f: Facts, source_path: str | None, index_dtype: str | None) -> None:
    """Check the plugin contract against `source_path` (wheel or tree), else the installed
    SGLang, else the cached source wheel."""
    installed = _version("sglang")
    f.add("sglang installed", installed or "no")
    f.add("plugin supports sglang", ", ".join(SUPPORTED_VERSIONS))
    if source_path:
        source = AstSource(source_path)
    elif installed:
        source = InstalledSource()
    else:
        wheel = default_wheel()
        if wheel is None:
            f.add("plugin contract", "not checked: no SGLang installed and no source wheel (run `make setup`)")
            return
        source = AstSource(wheel)
    f.release = release_of(source.version)
    release = f.release or NEWEST  # another version: refused by the check, in one line
    points = points_for(index_dtype, release=release) if index_dtype else points_of(release)
    report = check_contract(source, points)
    f.contract_ok = report.ok
    if report.build_note:
        f.add("sglang build", report.build_note)
    if report.ok:
        f.add("plugin contract", report.summary())
    else:  # one line per break, each naming SGLang's file and line
        f.add("plugin contract", f"BROKEN: {len(report.problems)} break(s) against sglang "
                                 f"{report.version or 'of unknown version'} ({report.source})")
        for problem in report.problems:
            f.add("contract break", problem)
    f.add("plugin entry point", "registered (sglang.srt.plugins: niah)" if entry_point_registered()
          else "NOT registered: pip install 'niah-lab[sglang]' in this environment")


def kernel_facts(f: Facts) -> None:
    try:
        have = available()
    except Exception as e:  # a broken kernels package is a fact to report
        f.add("niah.kernels", f"import failed: {type(e).__name__}: {e}")
        return
    f.add("niah.kernels", ", ".join(f"{k}: {v}" for k, v in have.items()))


def gather(source_path: str | None = None, index_dtype: str | None = None) -> Facts:
    f = Facts()
    f.add("python", f"{platform.python_version()} ({platform.machine()})")
    contract_facts(f, source_path, index_dtype)
    torch_facts(f)
    kernel_facts(f)
    return f

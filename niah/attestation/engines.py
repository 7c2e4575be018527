"""What a configuration's recorded `engine` tells the attestation rules: one row of data each.

The serving layer's engines record their name in each configuration's manifest entry
(`engine`); the rules (niah.attestation.rules) judge run folders written by any niah, so
what a name implies for attestation is kept here, as data (the harness never imports
serving). `facts(engine)` is the row; an engine with no row (external, command, one added
later that attests nothing) must prove nothing: its labels are judged by what its server
reports, and are UNATTESTED where it reports nothing.

- `must_prove`: niah launches it and it attests what it ran, so a missing or unreadable
  attestation is INVALID.
- `schedulers`: its /server_info lists scheduler processes (SGLang's `internal_states`):
  a reading without niah_attestation means niah's plugin did not run in them.
- `stock_arm`: its kernels = "stock" arm runs without niah's plugin: judged as the
  plugin's absence in every scheduler (rules._stock), not on an attestation.
- `label_defaults(labels)`: the labels with what its launcher fills in where the file is silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from niah.kernels import forms


def _as_stated(labels: dict) -> dict:
    return labels


def _sglang_defaults(labels: dict) -> dict:
    """niah's SGLang launcher: fp8 keys by default; bf16 runs on niah's kernels, others on SGLang's."""
    labels.setdefault("index_dtype", forms.DEFAULT)
    labels.setdefault("kernels", forms.default_kernels(labels["index_dtype"]))
    return labels


@dataclass(frozen=True)
class EngineFacts:
    must_prove: bool = False
    schedulers: bool = False
    stock_arm: bool = False
    label_defaults: Callable[[dict], dict] = field(default=_as_stated)


NOTHING = EngineFacts()
FACTS: dict[str, EngineFacts] = {
    "sglang": EngineFacts(must_prove=True, schedulers=True, stock_arm=True, label_defaults=_sglang_defaults),
    "embedded": EngineFacts(must_prove=True),
}


def facts(engine: str | None) -> EngineFacts:
    """The attestation facts of a recorded engine name (none: NOTHING to prove)."""
    return FACTS.get(engine, NOTHING) if isinstance(engine, str) else NOTHING

"""engine = "external": a running server someone else serves, reached at its `endpoint`.

Not launched: niah never starts or restarts it (its configurations are swept concurrently,
before the launched ones). Its keys: the endpoint (required), the model, the variable that
holds its API key, and labels (attention, index keys, rotation, top-k) recorded as the
configuration's axes, unattested unless the server reports them. `plan` is its dry-run line.
"""

from __future__ import annotations

from niah.kernels import forms
from niah.kernels.rotation import ROTATIONS
from niah.serving.matrix.engines.base import Engine
from niah.serving.matrix.keys import choice, choice_of, int_range, string, url

KEYS = {
    "endpoint": url,
    "model": string,
    "api_key_env": string,
    "attention": choice("dense", "dsa"),
    "index_dtype": choice_of(lambda: forms.names(forms.EXTERNAL)),  # a label: any form the table knows
    "index_rotation": choice(*ROTATIONS),
    "index_topk": int_range(1),
}


def plan(cfg) -> str:
    model = cfg.settings.get("model")
    return f"(external) {cfg.settings['endpoint']}" + (f" model={model}" if model else "")


ENGINE = Engine("external", KEYS, required=("endpoint",), launched=False, plan=plan)

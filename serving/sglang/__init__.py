"""niah's SGLang plugin: bf16 index keys and niah's indexer kernels inside SGLang's default
paths (the stock arm is SGLang alone: `python -m sglang.launch_server`).

- contract.py: every SGLang symbol the plugin touches, as data, and the check.
- command.py: `build_sglang_command(SGLangLaunch(...)) -> (argv, env)`.
- plugin.py: installs the patches (entry point `sglang.srt.plugins` -> niah).
- replacements.py / bf16_cache.py: the functions put in SGLang's place (pure torch);
  v32.py / v4.py: DeepSeek-V3.2's and V4's indexer in SGLang's default paths.
- __main__.py: `python -m niah.serving.sglang`, the launch entry.

Importing this package imports neither sglang nor torch.
"""

from niah.serving.sglang.command import SGLangLaunch, build_sglang_command, format_command

__all__ = ["SGLangLaunch", "build_sglang_command", "format_command"]

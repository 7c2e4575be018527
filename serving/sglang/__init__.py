"""niah's SGLang plugin: routes the DeepSeek indexer to niah.kernels, adds bf16 index keys.

- contract.py: every SGLang symbol the plugin touches, as data, and the check.
- command.py: `build_sglang_command(SGLangLaunch(...)) -> (argv, env)`.
- plugin.py: installs the patches (entry point `sglang.srt.plugins` -> niah).
- replacements.py / bf16_cache.py: the functions put in SGLang's place (pure torch).
- __main__.py: `python -m niah.serving.sglang`, the launch entry.

Importing this package imports neither sglang nor torch.
"""

from niah.serving.sglang.command import SGLangLaunch, build_sglang_command, format_command

__all__ = ["SGLangLaunch", "build_sglang_command", "format_command"]

"""Where each key of a matrix file sits, for error messages that name the line.

tomllib does the real parsing (serving/matrix/); this only maps (section, key) and a
value inside an array to the line that holds it.
"""

from __future__ import annotations

import re
from typing import Any

_HEADER_RE = re.compile(r"^\s*(\[\[?)\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^\s*([A-Za-z0-9_\-\"']+)\s*(\.|=)")


class TomlLines:
    """Where each key of the file sits: (section, key) -> line. Sections: "" (top level),
    "axes", ("config", i). Good enough for messages; tomllib does the real parsing."""

    def __init__(self, text: str):
        self.text_lines = text.splitlines()
        self.keys: dict[tuple[Any, str], int] = {}
        self.sections: dict[Any, int] = {}
        section: Any = ""
        n_config = -1
        for lineno, raw in enumerate(self.text_lines, start=1):
            m = _HEADER_RE.match(raw)
            if m and not raw.lstrip().startswith("[\"") and "=" not in raw.split("#")[0]:
                double, name = m.group(1) == "[[", m.group(2).strip().strip("\"'")
                if double and name == "config":
                    n_config += 1
                    section = ("config", n_config)
                elif not double and name.startswith("config.") and n_config >= 0:
                    section = ("config", n_config)  # [config.env] belongs to the last [[config]]
                    self.keys.setdefault((section, name.split(".", 1)[1]), lineno)
                else:
                    section = name
                    self.keys.setdefault(("", name), lineno)  # e.g. [env] at the top level
                self.sections.setdefault(section, lineno)
                continue
            k = _KEY_RE.match(raw)
            if k:
                key = k.group(1).strip("\"'")
                self.keys.setdefault((section, key), lineno)

    def of(self, section: Any, key: str | None = None) -> int:
        if key is not None and (section, key) in self.keys:
            return self.keys[(section, key)]
        if key is not None and section == "" and key in self.sections:
            return self.sections[key]  # a key written as its own table, e.g. [env]
        return self.sections.get(section, 1)

    def of_value(self, section: Any, key: str, value: Any) -> int:
        """The line of `value` inside `key = [...]` (arrays may span lines)."""
        start = self.of(section, key)
        lit = re.compile(r"(?<![\w.])" + re.escape(_toml_literal(value)) + r"(?![\w.])")
        for i in range(start - 1, min(len(self.text_lines), start + 50)):
            line = self.text_lines[i].split("#")[0]
            if i >= start and (_KEY_RE.match(line) or _HEADER_RE.match(line)):
                break
            part = line.split("=", 1)[1] if i == start - 1 and "=" in line else line
            if lit.search(part):
                return i + 1
        return start


def _toml_literal(v: Any) -> str:
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)

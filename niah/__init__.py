"""niah: long-context recall lab for sparse-attention serving.

`__version__` is the one place niah's version is set: the distribution (niah-lab on PyPI,
pyproject.toml reads it from here at build time), `niah --version` and every run's manifest
(`niah_version`) take it from here. Keep it a plain string literal (setuptools reads it
without importing the package).
"""

__version__ = "0.1.0"

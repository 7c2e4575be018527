"""The wheel's packages are found, not listed: niah/ is `niah`, kernels/ is `niah.kernels` and
serving/ is `niah.serving` (pyproject.toml's package-dir), and every folder below them that holds
modules or package data is a package of its dotted name. Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup


def packages_under(folder: str, name: str) -> list[str]:
    found = find_namespace_packages(where=folder, exclude=["*__pycache__*", ".*", "*.egg-info"])
    return [name] + [f"{name}.{p}" for p in found]


setup(packages=packages_under("niah", "niah") + packages_under("kernels", "niah.kernels")
      + packages_under("serving", "niah.serving"))

"""Packages for setuptools: the source root app/ holds `ledgerloop`, and the repository's
top-level migrations/ ships inside it as `ledgerloop._migrations`, so `ledgerloop db upgrade`
works from an installed wheel. Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages("app", include=["ledgerloop", "ledgerloop.*"]),
        "ledgerloop._migrations",
        "ledgerloop._migrations.versions",
    ],
    package_dir={"": "app", "ledgerloop._migrations": "migrations"},
)

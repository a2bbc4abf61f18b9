"""Packages for setuptools: the source root app/ holds `ledgerloop`, and the repository's
top-level migrations/ ships inside it as `ledgerloop._migrations`, so `ledgerloop db upgrade`
works from an installed wheel. Everything else is in pyproject.toml.

Namespace discovery: directories that hold only data (http/static, models/scripts,
examples/data) are packages too, so their files ship as package data; with plain
find_packages setuptools would warn that they "would be ignored" and leave them out."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(
            "app", include=["ledgerloop", "ledgerloop.*"], exclude=["*.__pycache__"]
        ),
        "ledgerloop._migrations",
        "ledgerloop._migrations.versions",
    ],
    package_dir={"": "app", "ledgerloop._migrations": "migrations"},
)

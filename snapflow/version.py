"""The installed Snapflow version, read once from the package metadata (the CLI's
``--version``, the Spark driver's preflight). Light: the standard library only."""

from __future__ import annotations

import importlib.metadata


def installed_version(missing: str) -> str:
    """This Python's installed Snapflow version, or ``missing`` when there is none."""
    try:
        return importlib.metadata.version("snapflow")
    except importlib.metadata.PackageNotFoundError:
        return missing

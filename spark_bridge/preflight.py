"""The driver's preflight: before a job's first deployment, check that the executors' Python
imports the same Snapflow as the driver.

An executor whose Python has another Snapflow (or none) cannot run the job's barrier stage:
its tasks fail at unpickling or, worse, run other code against this coordinator, and the
driver's restart strategy would redeploy the stage forever. So ``check_executors`` runs one
small Spark job first (one task per slot, so a local master or a small cluster is covered
whole; a larger cluster is sampled) whose tasks report their Snapflow version and Python, and
refuses the job with ``FailedPreconditionError`` naming ``PYSPARK_PYTHON`` and both versions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from snapflow.errors import FailedPreconditionError
from snapflow.version import installed_version

if TYPE_CHECKING:
    from pyspark import SparkContext

MISSING = "none"
"""The version a Python reports that has no Snapflow installed."""


def snapflow_version() -> str:
    """This Python's installed Snapflow version (``MISSING`` without one)."""
    return installed_version(MISSING)


def _probe() -> Callable[[Any], tuple[str, str]]:
    """A task function that reports (Snapflow version, Python executable). A nested function,
    so that cloudpickle ships it by value: it must run on an executor that cannot import
    Snapflow at all (the very case to report)."""

    missing = MISSING  # captured by value: the executor need not import snapflow

    def probe(_: Any) -> tuple[str, str]:
        import importlib.metadata as metadata
        import sys

        try:
            return metadata.version("snapflow"), sys.executable
        except metadata.PackageNotFoundError:
            return missing, sys.executable

    return probe


def check_executors(sc: SparkContext, tasks: int) -> None:
    """Raise ``FailedPreconditionError`` unless every probed executor Python has the driver's
    Snapflow version; ``tasks``: how many tasks probe (the job's slots)."""
    driver = snapflow_version()
    previous = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription("snapflow preflight: the executors' Snapflow version")
    try:
        found = sc.parallelize(range(tasks), tasks).map(_probe()).collect()
    finally:
        sc.setLocalProperty("spark.job.description", previous)  # type: ignore[arg-type]
    other = sorted({(version, python) for version, python in found if version != driver})
    if not other:
        return
    pyspark_python = (
        sc.getConf().get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") or "unset"
    )
    seen = "; ".join(f"{python} has snapflow {version}" for version, python in other[:3])
    raise FailedPreconditionError(
        f"the executors' Python does not have the driver's snapflow {driver}: {seen} "
        f"(PYSPARK_PYTHON={pyspark_python}); install snapflow {driver} into the executors' "
        "Python, or point PYSPARK_PYTHON (spark.pyspark.python) at a Python that has it"
    )

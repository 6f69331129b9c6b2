"""The chaos suite's short seeded subset (``python -m chaos --quick``), in the test suite.

Real processes (Redis, two coordinators with leader election when this build has it, worker
processes), worker SIGKILLs in every checkpoint mode (one of the jobs a two-source join), a leader kill, a Redis kill, a split
brain, 200 hostile messages (unary RPCs and agents' Exchange streams) and one job on a
Sentinel-backed coordinator whose Redis master is SIGKILLed mid-job; the run must end with
every job finished and its output exact.
The full run is ``make chaos`` (docs/chaos.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_quick_chaos_run_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    run = subprocess.run(
        [sys.executable, "-m", "chaos", "--quick", "--seed", "3", "--work-dir",
         str(tmp_path / "work"), "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = json.loads(out.read_text())
    m = result["metrics"]
    assert result["failures"] == [], result
    # Kills land at seeded points; under load a job may end before its last one.
    # Three jobs and the Sentinel job, and three more when the first saw under six kills.
    assert m["worker_kills"] >= 1 and m["jobs_finished"] == m["jobs_total"] in (4, 7), m
    assert m["join_jobs"] == 1, m  # a job of two sources into a keyed two-input task
    assert m["sentinel_failovers"] == 1, m
    assert m["hostile_messages"] == 200 and m["hostile_unexpected_status"] == 0, result
    assert m["hostile_exchange_streams"] >= 7, result  # every kind at least once
    assert (m["lost"], m["duplicated"], m["stale_deleted_files"]) == (0, 0, 0), m
    if m["high_availability"]:
        assert m["leader_kills"] >= 1 and m["split_brains"] >= 1, m

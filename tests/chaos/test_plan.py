"""The chaos run's top-up rule (pure logic: the job runs are replaced by a recording fake)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest

# chaos/ is a top-level package of the repository (like bench/), not an installed one.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from chaos.suite import Plan, Run
from chaos.workload import JobSpec


def _run(tmp_path: Path, plan: Plan, kills_per_round: list[int]) -> tuple[Run, list[list[str]]]:
    run = Run(seed=5, plan=plan, work_dir=tmp_path, log=lambda _msg: None)
    rounds: list[list[str]] = []
    per_round = iter(kills_per_round)

    async def fake_run_jobs(specs: list[JobSpec]) -> None:
        rounds.append([s.name for s in specs])
        run.figures.worker_kills += next(per_round)

    run._run_jobs = fake_run_jobs  # type: ignore[method-assign]
    return run, rounds


@pytest.mark.parametrize("ha", [False, True])
def test_extra_jobs_run_until_the_worker_kill_target(tmp_path: Path, ha: bool) -> None:
    plan = dataclasses.replace(Plan.quick(), jobs=3, kills_per_job=2, extra_jobs=7)
    run, rounds = _run(tmp_path, plan, [1, 2, 5])
    run.ha = ha
    run.figures.leader_kills = plan.leader_kills  # the leader target is met
    specs = run._job_specs()
    run.figures.worker_kills = 2  # the planned jobs fell 4 short of 3 x 2
    run.figures.jobs_total = len(specs)
    asyncio.run(run._run_extra_jobs(specs))
    # Rounds of concurrent_jobs (3) while short of 6 kills: 2 -> 3 -> 5 -> 10; the third
    # round is cut to the one job left of extra_jobs (7).
    assert rounds == [["job-003", "job-004", "job-005"], ["job-006", "job-007", "job-008"],
                      ["job-009"]]  # fmt: skip
    assert [s.name for s in specs] == [f"job-{i:03d}" for i in range(10)]
    assert run.figures.jobs_total == 10 and not run._short_of_targets()


def test_no_extra_jobs_once_the_targets_are_met(tmp_path: Path) -> None:
    plan = dataclasses.replace(Plan.quick(), jobs=3, kills_per_job=2, extra_jobs=6)
    run, rounds = _run(tmp_path, plan, [])
    run.figures.worker_kills = 6
    run.figures.leader_kills = plan.leader_kills
    specs = run._job_specs()
    asyncio.run(run._run_extra_jobs(specs))
    assert rounds == [] and len(specs) == 3


def test_leader_kills_short_adds_jobs_only_with_a_standby(tmp_path: Path) -> None:
    plan = dataclasses.replace(Plan.quick(), jobs=3, kills_per_job=1, extra_jobs=3)
    run, rounds = _run(tmp_path, plan, [0])
    run.figures.worker_kills = 3
    run.figures.leader_kills = 0
    run.ha = False
    assert not run._short_of_targets()
    run.ha = True
    specs = run._job_specs()
    asyncio.run(run._run_extra_jobs(specs))
    assert rounds == [["job-003", "job-004", "job-005"]]  # then capped by extra_jobs

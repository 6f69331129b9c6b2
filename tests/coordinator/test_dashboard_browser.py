"""The dashboard in a real headless browser: Debian's chromium driven through WebDriver
(selenium with Debian's chromedriver) against a coordinator running a real job on in-process
agents (a generator source, a keyed count, a transactional file sink).

It loads the page, waits for the checkpoint history to show completed checkpoints (with the
retention marker on the older ones), opens one checkpoint's per-subtask details and the other
tabs, checks the browser logged no error (a script error or a Content-Security-Policy
violation), and saves a screenshot: in the test's tmp dir and at
``test-artifacts/dashboard.png`` (git-ignored).

The browser is a prerequisite, never a reason to skip: ``make test`` installs it (``make
browser``), and without it this test fails saying what to install.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from kit.coordinator import Running, running_coordinator
from kit.polling import wait_until_async
from kit.workers import count_graph, submit_graph

from snapflow.v1 import common_pb2 as pb
from snapflow.v1 import coordinator_pb2 as cpb
from snapflow.worker.api.keyed_operators import KeyedCount
from snapflow.worker.connectors.file_sink import TransactionalFileSink
from snapflow.worker.connectors.split_sources import GeneratorSource
from snapflow.worker.runtime.agent import Agent

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "test-artifacts" / "dashboard.png"
WAIT_S = 30.0
FLAGS = (
    "--headless",
    "--no-sandbox",  # we run as root in CI and containers
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1500,2200",
)


def _require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(
            f"the dashboard test needs Debian's chromium and its WebDriver: {', '.join(missing)} "
            f"missing. Install them with `apt-get install -y chromium chromium-driver` (as root; "
            f"`make test` runs `make browser`, which does this)",
            pytrace=False,
        )


def _browse(url: str, profile: Path, shot: Path) -> dict[str, Any]:
    """Drive the dashboard; returns what it saw. Runs in a thread (selenium blocks)."""
    from selenium import webdriver
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=CHROMEDRIVER, log_output=str(profile.parent / "driver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    try:
        # The page re-renders its tables on every refresh: an element read while that happens
        # is stale, and the wait reads it again.
        wait = WebDriverWait(
            driver,
            WAIT_S,
            poll_frequency=0.2,
            ignored_exceptions=(StaleElementReferenceException,),
        )

        def rows(selector: str) -> list[str]:
            return list(
                wait.until(lambda d: [r.text for r in d.find_elements(By.CSS_SELECTOR, selector)])
            )

        driver.get(url)
        completed = "#checkpoint-history tbody tr[data-status='COMPLETED']"
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, completed)) >= 3)

        # The page refreshes by itself: the newest id shown grows without a reload.
        def newest(d: Any) -> int:
            return int(
                d.find_element(By.CSS_SELECTOR, completed).get_attribute("data-checkpoint-id") or 0
            )

        first = newest(driver)
        wait.until(lambda d: newest(d) > first)
        seen: dict[str, Any] = {
            "state": driver.find_element(By.ID, "job-state").text,
            "counts": driver.find_element(By.ID, "checkpoint-counts").text,
            "discarded": len(
                driver.find_elements(By.CSS_SELECTOR, "#checkpoint-history tr.discarded")
            ),
            "latest": driver.find_element(By.ID, "checkpoint-latest").text,
            "summary": driver.find_element(By.ID, "checkpoint-summary").text,
            "config": driver.find_element(By.ID, "checkpoint-config").text,
        }
        # One checkpoint's per-subtask details.
        row = driver.find_elements(By.CSS_SELECTOR, completed)[1]
        seen["details_id"] = row.get_attribute("data-checkpoint-id")
        row.click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#subtasks tbody tr")) > 0)
        seen["subtasks"] = rows("#subtasks tbody tr")
        seen["details_title"] = driver.find_element(By.ID, "details-id").text
        driver.save_screenshot(str(shot))
        # The other tabs.
        driver.find_element(By.ID, "tab-link-overview").click()
        wait.until(lambda d: d.find_element(By.ID, "tab-overview").is_displayed())
        seen["tasks"] = rows("#tasks tbody tr")
        seen["edges"] = driver.find_element(By.ID, "edges").text
        driver.find_element(By.ID, "tab-link-exceptions").click()
        wait.until(lambda d: d.find_element(By.ID, "tab-exceptions").is_displayed())
        seen["exceptions"] = driver.find_element(By.ID, "tab-exceptions").text
        seen["jobs"] = driver.find_element(By.ID, "jobs").text
        seen["log"] = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        return seen
    finally:
        driver.quit()
        process = service.process
        assert process is None or process.poll() is not None, "chromedriver still running"


async def _completed(c: Running, job_id: str, at_least: int) -> int:
    stats = await c.stub.GetCheckpointStats(cpb.GetCheckpointStatsRequest(job_id=job_id), timeout=5)
    return int(stats.counts.completed) if stats.counts.completed >= at_least else 0


@pytest.mark.slow
def test_dashboard_shows_the_checkpoint_history_of_a_running_job(
    redis_url: str, tmp_path: Path
) -> None:
    _require_browser()
    shot = tmp_path / "dashboard.png"
    source = GeneratorSource(None, rate_per_s=5000, num_keys=50, batch_size=500, seed=3)
    graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(tmp_path / "out")))

    async def main() -> dict[str, Any]:
        async with running_coordinator(redis_url, str(tmp_path / "cp"), metrics_port=0) as c:
            config = pb.CheckpointConfig(interval_ms=300, retained=2)
            job_id = await submit_graph(c.stub, graph, config)
            agents = [Agent(c.address, job_id, slot=s, num_slots=2) for s in range(2)]
            for agent in agents:
                await agent.start()
            run = asyncio.gather(*(a.run() for a in agents))
            try:
                await wait_until_async(
                    lambda: _completed(c, job_id, 3), "3 completed checkpoints", timeout_s=WAIT_S
                )
                url = f"http://127.0.0.1:{c.coordinator.metrics_port}/#/jobs/{job_id}/checkpoints"
                seen = await asyncio.to_thread(_browse, url, tmp_path / "chromium", shot)
                seen["job_id"] = job_id
                await c.stub.CancelJob(cpb.CancelJobRequest(job_id=job_id), timeout=5)
                async with asyncio.timeout(WAIT_S):
                    await asyncio.gather(run, return_exceptions=True)
                return seen
            finally:
                run.cancel()
                await asyncio.gather(run, return_exceptions=True)
                for agent in agents:
                    await agent.stop()

    seen = asyncio.run(main())
    ARTIFACT.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACT)

    assert seen["log"] == [], seen["log"]
    assert seen["state"] == "RUNNING"
    assert "Completed" in seen["counts"]
    assert seen["discarded"] >= 1, "retention keeps 2: older completed rows carry the marker"
    assert seen["latest"].startswith("Latest completed checkpoint #")
    assert "End to end duration" in seen["summary"] and "p99" in seen["summary"]
    assert "State size" in seen["summary"] and "Incremental size" in seen["summary"]
    assert "Retained checkpoints 2" in seen["config"] and "300 ms" in seen["config"]
    assert seen["details_title"].startswith(seen["details_id"])
    assert len(seen["subtasks"]) == 4  # 2 vertices x parallelism 2, all acknowledged
    assert all(" yes " in f" {r} " for r in seen["subtasks"]), seen["subtasks"]
    assert len(seen["tasks"]) == 4 and all("RUNNING" in t for t in seen["tasks"]), seen["tasks"]
    assert "HASH" in seen["edges"] and "key" in seen["edges"]
    assert "No exceptions" in seen["exceptions"]
    assert seen["job_id"] in seen["jobs"]
    assert shot.stat().st_size > 10_000 and ARTIFACT.exists()

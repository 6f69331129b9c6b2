"""The dashboard in a real headless browser: Debian's chromium driven through WebDriver
(selenium with Debian's chromedriver) against a coordinator running a real job on in-process
agents (a generator source fanning out to a keyed count with a transactional file sink and to a
second file sink).

It loads the page, waits for the checkpoint charts and the checkpoint history to show completed
checkpoints (with the retention marker on the older ones), opens one checkpoint's per-subtask
details, then the overview (the job graph drawn, every task's busy and backpressured time and
watermark) and the exceptions tab, checks the browser logged no error (a script error or a
Content-Security-Policy violation), and saves screenshots of the checkpoints tab and of the
overview: in the test's tmp dir and at ``test-artifacts/dashboard.png`` and
``test-artifacts/dashboard-overview.png`` (git-ignored; docs/images/ holds copies).

The browser is a prerequisite, never a reason to skip: ``make test`` installs it (``make
browser``), and without it this test fails saying what to install.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from kit.coordinator import Running, running_coordinator
from kit.polling import wait_until_async
from kit.workers import count_graph, op_spec, submit_graph

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
OVERVIEW_ARTIFACT = ROOT / "test-artifacts" / "dashboard-overview.png"
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


def _browse(url: str, profile: Path, shot: Path, overview_shot: Path) -> dict[str, Any]:
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

        # The charts: one point per completed checkpoint of the history, per series.
        def points(d: Any, chart: str) -> list[int]:
            return [
                len(g.find_elements(By.CSS_SELECTOR, "circle"))
                for g in d.find_elements(By.CSS_SELECTOR, f"#{chart} svg g.series")
            ]

        charts = ("chart-duration", "chart-size", "chart-alignment")
        wait.until(lambda d: all(p and min(p) >= 3 for p in (points(d, c) for c in charts)))
        completed_rows = len(driver.find_elements(By.CSS_SELECTOR, completed))
        seen: dict[str, Any] = {
            "charts": {c: points(driver, c) for c in charts},
            "completed_rows": completed_rows,
            "chart_axis": driver.find_element(By.CSS_SELECTOR, "#chart-duration svg").text,
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
        # A checkpoint that ended is fetched once: after it left the coordinator's history (10
        # checkpoints), the next refreshes still show its details and request nothing that
        # would now answer 404 (the browser log stays empty, asserted below).
        gone = f"#checkpoint-history tbody tr[data-checkpoint-id='{seen['details_id']}']"
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, gone))
        after = newest(driver)
        wait.until(lambda d: newest(d) > after)  # at least one more refresh
        seen["details_title_evicted"] = driver.find_element(By.ID, "details-id").text
        seen["error_evicted"] = driver.find_element(By.ID, "error").text
        # The other tabs.
        driver.find_element(By.ID, "tab-link-overview").click()
        wait.until(lambda d: d.find_element(By.ID, "tab-overview").is_displayed())

        # Every task's metrics come with its agent's heartbeats: busy and backpressured time
        # as a share, and a watermark once the sources emitted one and it reached the task.
        def task_metrics(d: Any) -> list[tuple[str, str, str, str]] | None:
            out = []
            for row in d.find_elements(By.CSS_SELECTOR, "#tasks tbody tr"):
                cells = [
                    row.find_element(By.CSS_SELECTOR, f".metric-{kind}").text
                    for kind in ("busy", "backpressured", "watermark")
                ]
                if not cells[0].endswith("%") or cells[2] == "No watermark":
                    return None
                out.append((row.get_attribute("data-vertex-id") or "", *cells))
            return out or None

        seen["task_metrics"] = wait.until(task_metrics)
        seen["tasks"] = rows("#tasks tbody tr")
        seen["edges"] = driver.find_element(By.ID, "edges").text
        # The graph: a node per vertex in its column, an edge per job edge.
        wait.until(lambda d: "busy" in d.find_element(By.ID, "job-graph").text)

        # The graph is redrawn with every refresh: read it whole inside the wait, which reads
        # again when an element went stale meanwhile.
        def graph(d: Any) -> dict[str, Any]:
            return {
                "nodes": {
                    n.get_attribute("data-vertex-id"): (n.get_attribute("data-layer"), n.text)
                    for n in d.find_elements(By.CSS_SELECTOR, "#job-graph g.graph-node")
                },
                "graph_edges": {
                    (e.get_attribute("data-source"), e.get_attribute("data-target")): e.text
                    for e in d.find_elements(By.CSS_SELECTOR, "#job-graph g.graph-edge")
                },
                "arrows": len(
                    d.find_elements(By.CSS_SELECTOR, "#job-graph g.graph-edge path[marker-end]")
                ),
            }

        seen.update(wait.until(graph))
        # The layout of graphs this job does not have: two sources, a join, a diamond.
        seen["layouts"] = driver.execute_script(
            """
            const layout = (ids, pairs) => {
              const r = graphLayout(
                ids.map((id) => ({ vertex_id: id })),
                pairs.map(([s, t]) => ({ source_vertex_id: s, target_vertex_id: t })),
              );
              return { layers: Object.fromEntries(r.layer), columns: r.columns };
            };
            return [
              layout(["s1", "s2", "m", "j", "x", "sink"],
                [["s1", "m"], ["m", "j"], ["s2", "j"], ["j", "sink"], ["s1", "x"], ["x", "sink"]]),
              layout(["a", "b", "c", "d"], [["a", "b"], ["a", "c"], ["b", "d"], ["c", "d"]]),
            ];
            """
        )
        # The overview is shorter than the window: its screenshot ends below the page.
        page_height = int(driver.execute_script("return document.body.scrollHeight"))
        driver.set_window_size(1500, min(2200, page_height + 240))
        driver.save_screenshot(str(overview_shot))
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
    overview_shot = tmp_path / "dashboard-overview.png"
    # Event time from now, so that the watermarks read as times of today.
    source = GeneratorSource(
        None, rate_per_s=5000, num_keys=50, batch_size=500, seed=3, start_ms=int(time.time() * 1000)
    )
    graph = count_graph(source, KeyedCount("key"), TransactionalFileSink(str(tmp_path / "out")))
    # A fan-out: the source also feeds a second sink, rebalanced.
    graph.vertices.append(
        pb.JobVertex(
            vertex_id="mirror",
            name="mirror",
            parallelism=2,
            max_parallelism=128,
            operators=[op_spec("mirror", TransactionalFileSink(str(tmp_path / "mirror")))],
        )
    )
    graph.edges.append(
        pb.JobEdge(
            source_vertex_id="source",
            target_vertex_id="mirror",
            partitioner=pb.PARTITIONER_KIND_REBALANCE,
        )
    )

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
                seen = await asyncio.to_thread(
                    _browse, url, tmp_path / "chromium", shot, overview_shot
                )
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
    shutil.copyfile(overview_shot, OVERVIEW_ARTIFACT)

    assert seen["log"] == [], seen["log"]
    assert seen["state"] == "RUNNING"
    assert "Completed" in seen["counts"]
    assert seen["discarded"] >= 1, "retention keeps 2: older completed rows carry the marker"
    assert seen["latest"].startswith("Latest completed checkpoint #")
    assert "End to end duration" in seen["summary"] and "p99" in seen["summary"]
    assert "State size" in seen["summary"] and "Incremental size" in seen["summary"]
    assert "Retained checkpoints 2" in seen["config"] and "300 ms" in seen["config"]
    assert seen["details_title"].startswith(seen["details_id"])
    assert seen["details_title_evicted"].startswith(seen["details_id"]), seen
    assert seen["error_evicted"] == "", seen
    assert len(seen["subtasks"]) == 6  # 3 vertices x parallelism 2, all acknowledged
    assert all(" yes " in f" {r} " for r in seen["subtasks"]), seen["subtasks"]
    assert len(seen["tasks"]) == 6 and all("RUNNING" in t for t in seen["tasks"]), seen["tasks"]
    assert "HASH" in seen["edges"] and "key" in seen["edges"]
    # The charts: a point per completed checkpoint shown (the size chart: full and incremental).
    charts = seen["charts"]
    assert len(charts["chart-duration"]) == 1 and len(charts["chart-alignment"]) == 1, charts
    assert len(charts["chart-size"]) == 2, charts
    assert all(n >= 3 for series in charts.values() for n in series), charts
    assert re.search(r"#\d+", seen["chart_axis"]), seen["chart_axis"]  # checkpoint ids below
    # The graph: the source in the first column, both consumers in the second.
    nodes = seen["nodes"]
    assert set(nodes) == {"source", "count", "mirror"}, nodes
    assert [nodes[v][0] for v in ("source", "count", "mirror")] == ["0", "1", "1"], nodes
    assert all("parallelism 2" in text and "busy" in text for _, text in nodes.values()), nodes
    assert set(seen["graph_edges"]) == {("source", "count"), ("source", "mirror")}
    assert seen["graph_edges"][("source", "count")] == "HASH (key)"
    assert seen["graph_edges"][("source", "mirror")] == "REBALANCE"
    assert seen["arrows"] == 2
    join, diamond = seen["layouts"]
    # Longest path from a source: the join after both of its inputs, the sink after the join.
    assert join["layers"] == {"s1": 0, "s2": 0, "m": 1, "x": 1, "j": 2, "sink": 3}, join
    assert diamond["columns"] == [["a"], ["b", "c"], ["d"]], diamond
    # Per task: busy and backpressured as a share of the time, the watermark as a time.
    task_metrics = seen["task_metrics"]
    assert sorted(v for v, *_ in task_metrics) == ["count"] * 2 + ["mirror"] * 2 + ["source"] * 2
    for vertex, busy, backpressured, watermark in task_metrics:
        assert re.fullmatch(r"\d+%", busy) and re.fullmatch(r"\d+%", backpressured), vertex
        assert int(busy[:-1]) + int(backpressured[:-1]) <= 101, (vertex, busy, backpressured)
        assert re.search(r"\d:\d\d", watermark), (vertex, watermark)  # a time of day
    assert "No exceptions" in seen["exceptions"]
    assert seen["job_id"] in seen["jobs"]
    assert shot.stat().st_size > 10_000 and ARTIFACT.exists()
    assert overview_shot.stat().st_size > 10_000 and OVERVIEW_ARTIFACT.exists()

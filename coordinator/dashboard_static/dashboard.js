// The Snapflow dashboard: polls the coordinator's JSON API (/api/...) and renders it.
// Plain DOM, no framework and no build step; every value goes in through textContent.
"use strict";

const REFRESH_MS = 2000;
const TOKEN_KEY = "snapflow-token";

const view = { jobId: null, tab: "overview", checkpointId: null };
let busy = false;
let again = false; // a refresh was asked for while one ran (a click, a new route)
// The details of a checkpoint that ended never change (but for "discarded", which the history
// rows carry): fetched once, so a checkpoint that has left the coordinator's bounded history
// since stays readable instead of turning into a 404 on the next refresh.
let endedDetails = null; // { key: "<job>/<checkpoint>", data }

// --- helpers -------------------------------------------------------------------------------

function $(id) {
  return document.getElementById(id);
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function enumName(value) {
  // JOB_STATE_RUNNING -> RUNNING (the proto enum prefixes)
  return String(value || "").replace(
    /^(JOB_STATE|TASK_STATE|CHECKPOINT_STATUS|CHECKPOINT_KIND|CHECKPOINT_MODE|PARTITIONER_KIND)_/,
    "",
  );
}

function time(ms) {
  if (!ms) return "–";
  return new Date(Number(ms)).toLocaleString();
}

function clock(ms) {
  // time of day only (the history is recent); the full date is in the cell's title
  if (!ms) return "–";
  const node = el("span", new Date(Number(ms)).toLocaleTimeString());
  node.title = time(ms);
  return node;
}

function shortPath(path) {
  // the last two segments (job dir / chk-N); the full path is in the title
  if (!path) return "";
  const node = el("code", path.split("/").filter(Boolean).slice(-2).join("/"));
  node.title = path;
  return node;
}

function duration(ms) {
  if (ms === undefined || ms === null) return "–";
  ms = Number(ms);
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

function bytes(n) {
  n = Number(n || 0);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return i === 0 ? `${n} B` : `${n.toFixed(n < 10 ? 2 : 1)} ${units[i]}`;
}

function task(attempt) {
  if (!attempt) return "–";
  return `${attempt.vertex_id}[${attempt.subtask_index}] attempt ${attempt.attempt}`;
}

// Fill a table body: rows is a list of arrays of cells; a cell is a value or a DOM node.
function fill(tableId, rows, options = {}) {
  const body = $(tableId).tBodies[0];
  const fresh = document.createElement("tbody");
  for (const row of rows) {
    const tr = document.createElement("tr");
    const cells = Array.isArray(row) ? row : row.cells;
    if (!Array.isArray(row)) {
      if (row.className) tr.className = row.className;
      for (const [key, value] of Object.entries(row.data || {})) tr.dataset[key] = value;
      if (row.onclick) {
        tr.classList.add("clickable");
        tr.addEventListener("click", row.onclick);
      }
    }
    for (const cell of cells) {
      const td = document.createElement(options.header && tr.cells.length === 0 ? "th" : "td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell === undefined || cell === null ? "–" : String(cell);
      if (typeof cell === "number") td.className = "num";
      tr.appendChild(td);
    }
    fresh.appendChild(tr);
  }
  body.replaceWith(fresh);
}

function card(label, value) {
  const node = el("div", null, "card");
  node.appendChild(el("div", label, "label"));
  node.appendChild(el("div", value, "value"));
  return node;
}

function cards(id, entries) {
  $(id).replaceChildren(...entries.map(([label, value]) => card(label, value)));
}

function stateSpan(value, prefix) {
  const name = enumName(value);
  return el("span", name, `${prefix}-${name.toLowerCase()}`);
}

// --- the API -------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { headers, cache: "no-store" });
  if (response.status === 401 || response.status === 403) {
    const body = await response.json().catch(() => ({}));
    throw new Unauthorized(body.error || response.statusText);
  }
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// --- routing: #/jobs/<id>/<tab>[/<checkpoint id>] --------------------------------------------

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/");
  if (parts[0] === "jobs" && parts[1]) {
    view.jobId = parts[1];
    view.tab = ["overview", "checkpoints", "exceptions"].includes(parts[2]) ? parts[2] : "overview";
    view.checkpointId = parts[2] === "checkpoints" && parts[3] ? parts[3] : null;
  } else {
    view.jobId = null;
    view.checkpointId = null;
  }
  refresh();
}

function go(jobId, tab, checkpointId) {
  location.hash = `#/jobs/${jobId}/${tab}` + (checkpointId ? `/${checkpointId}` : "");
}

// --- rendering -----------------------------------------------------------------------------

function renderJobs(data) {
  $("coordinator").textContent = `epoch ${data.epoch}${data.fenced ? " (fenced)" : ""}`;
  $("no-jobs").hidden = data.jobs.length > 0;
  fill(
    "jobs",
    data.jobs.map((job) => ({
      className: job.job_id === view.jobId ? "selected" : "",
      data: { jobId: job.job_id },
      onclick: () => go(job.job_id, view.tab),
      cells: [
        el("code", job.job_id),
        job.name,
        stateSpan(job.state, "state"),
        time(job.created_at_ms),
        `${job.running_tasks} / ${job.total_tasks} running`,
        job.restarts,
        job.latest_completed_checkpoint_id || "–",
      ],
    })),
  );
}

function renderJob(data) {
  const job = data.job;
  $("job-name").textContent = job.name;
  $("job-id").textContent = job.job_id;
  $("job-state").replaceChildren(stateSpan(job.state, "state"));
  $("job-failure").hidden = !job.failure;
  $("job-failure").textContent = job.failure ? `Failure: ${job.failure}` : "";
  cards("job-overview", [
    ["Created", time(job.created_at_ms)],
    ["Uptime", data.uptime_ms > 0 ? duration(data.uptime_ms) : "–"],
    ["Tasks running", `${job.running_tasks} / ${job.total_tasks}`],
    ["Restarts", job.restarts],
    ["Latest checkpoint", job.latest_completed_checkpoint_id || "–"],
  ]);
  const graph = job.graph || { vertices: [], edges: [] };
  fill(
    "vertices",
    graph.vertices.map((v) => [
      el("code", v.vertex_id),
      v.name,
      v.operators.map((o) => `${o.name || o.operator_id} (${o.kind})`).join(" → "),
      v.parallelism,
      v.max_parallelism || 128,
      v.is_source ? "yes" : "",
    ]),
  );
  fill(
    "edges",
    graph.edges.map((e) => [
      e.source_vertex_id,
      e.target_vertex_id,
      enumName(e.partitioner),
      e.key_field || "",
    ]),
  );
  renderGraph("job-graph", graph, data.tasks);
  fill(
    "tasks",
    data.tasks.map((t) => ({
      data: { vertexId: t.attempt.vertex_id, subtask: t.attempt.subtask_index },
      cells: [
        t.attempt.vertex_id,
        t.attempt.subtask_index,
        t.attempt.attempt,
        stateSpan(t.state, "state"),
        loadCell(t.metrics, "busy_ms_per_second", "busy"),
        loadCell(t.metrics, "backpressured_ms_per_second", "backpressured"),
        watermarkCell(t.metrics),
        t.address,
        t.failure || "",
      ],
    })),
  );
  const exceptions = data.exceptions;
  $("no-exceptions").hidden = exceptions.entries.length > 0;
  $("exceptions-truncated").hidden = !exceptions.truncated;
  fill(
    "exceptions",
    exceptions.entries.map((e) => [
      time(e.timestamp_ms),
      e.task ? task(e.task) : "the job",
      el("pre", e.message, "exception"),
    ]),
  );
}

// Busy or backpressured time: the share of the time, the ms per second in the title.
function loadCell(metrics, field, kind) {
  if (!metrics) {
    const none = el("span", "–", `metric-${kind}`);
    none.title = "not reported yet (the agent's next heartbeat brings it)";
    return none;
  }
  const msPerSecond = Number(metrics[field] || 0);
  const node = el("span", `${Math.round(msPerSecond / 10)}%`, `metric-${kind}`);
  if (msPerSecond >= 500) node.classList.add(`high-${kind}`);
  node.title = `${Math.round(msPerSecond)} ms/s over the last ${duration(metrics.period_ms)}`;
  return node;
}

const MAX_DATE_MS = 8.64e15; // the latest time a JavaScript Date holds; Long.MAX_VALUE is above

function watermarkCell(metrics) {
  if (!metrics || !metrics.has_watermark) return el("span", "No watermark", "metric-watermark muted");
  const ms = Number(metrics.watermark_ms);
  if (ms >= MAX_DATE_MS) return el("span", "end of event time", "metric-watermark");
  const node = el("span", new Date(ms).toLocaleString(), "metric-watermark");
  node.title = `${metrics.watermark_ms} ms`;
  return node;
}

function renderCharts(history) {
  const completed = history
    .filter((c) => enumName(c.status) === "COMPLETED")
    .sort((a, b) => Number(a.checkpoint_id) - Number(b.checkpoint_id));
  const series = (name, className, field) => ({
    name,
    className,
    points: completed.map((c) => ({ id: c.checkpoint_id, value: Number(c[field] || 0) })),
  });
  renderLineChart(
    "chart-duration",
    [series("end to end", "series-duration", "end_to_end_duration_ms")],
    duration,
  );
  renderLineChart(
    "chart-size",
    [
      series("full", "series-state", "state_size_bytes"),
      series("incremental", "series-incremental", "incremental_size_bytes"),
    ],
    bytes,
  );
  renderLineChart(
    "chart-alignment",
    [series("alignment", "series-alignment", "max_alignment_duration_ms")],
    duration,
  );
}

function summaryRow(label, c) {
  if (!c || !c.checkpoint_id) return [label, "none"];
  const what = `#${c.checkpoint_id} ${enumName(c.kind).toLowerCase()}`;
  const when = time(c.latest_ack_timestamp_ms || c.trigger_timestamp_ms);
  let size = bytes(c.state_size_bytes);
  if (c.shared_size_bytes) size += ` (${bytes(c.incremental_size_bytes)} incremental)`;
  let text = `${what}, ${when}, ${duration(c.end_to_end_duration_ms)}, ${size}`;
  if (c.failure_reason) text = `${what}, ${time(c.trigger_timestamp_ms)}: ${c.failure_reason} ${c.failure_message}`;
  if (c.external_path) text += ` — ${c.external_path}`;
  if (c.discarded) text += " (discarded)";
  return [label, text];
}

function renderCheckpoints(data) {
  const stats = data.stats;
  const counts = stats.counts;
  cards("checkpoint-counts", [
    ["Triggered", counts.triggered],
    ["In progress", counts.in_progress],
    ["Completed", counts.completed],
    ["Failed", counts.failed],
    ["Restored", counts.restored],
  ]);
  const restore = stats.latest_restore;
  fill(
    "checkpoint-latest",
    [
      summaryRow("Latest completed checkpoint", stats.latest_completed),
      summaryRow("Latest failed checkpoint", stats.latest_failed),
      summaryRow("Latest savepoint", stats.latest_savepoint),
      [
        "Latest restore",
        restore && restore.checkpoint_id
          ? `#${restore.checkpoint_id} (${restore.is_savepoint ? "savepoint" : "checkpoint"}), ` +
            `${time(restore.restore_timestamp_ms)} — ${restore.external_path}`
          : "none",
      ],
    ],
    { header: true },
  );
  renderCharts(stats.history);
  fill(
    "checkpoint-history",
    stats.history.map((c) => {
      const status = enumName(c.status);
      const statusCell = el("span", status, `status-${status.toLowerCase()}`);
      if (c.discarded) {
        const wrap = el("span");
        wrap.append(statusCell, el("span", "discarded", "discarded-marker"));
        wrap.title = "retention has removed this checkpoint";
        return historyRow(c, wrap, status);
      }
      if (c.failure_reason) statusCell.title = `${c.failure_reason}: ${c.failure_message}`;
      return historyRow(c, statusCell, status);
    }),
  );
  const quantiles = [
    ["End to end duration", stats.end_to_end_duration_ms, duration],
    ["State size", stats.state_size_bytes, bytes],
    ["Incremental size", stats.incremental_size_bytes, bytes],
    ["Processed during alignment", stats.processed_during_alignment_bytes, bytes],
    ["Persisted in-flight data", stats.persisted_in_flight_bytes, bytes],
  ];
  fill(
    "checkpoint-summary",
    quantiles.map(([label, q, format]) => [
      label,
      ...["min", "avg", "p50", "p90", "p99", "max"].map((k) => format(q ? q[k] : 0)),
    ]),
    { header: true },
  );
  const config = data.config;
  fill(
    "checkpoint-config",
    [
      ["Mode", enumName(config.mode) === "UNSPECIFIED" ? "ALIGNED" : enumName(config.mode)],
      ["Interval", config.interval_ms ? duration(config.interval_ms) : "periodic checkpoints off"],
      ["Timeout", duration(config.timeout_ms)],
      ["Minimum pause between checkpoints", duration(config.min_pause_ms)],
      ["Maximum concurrent checkpoints", config.max_concurrent],
      [
        "Aligned checkpoint timeout",
        config.aligned_checkpoint_timeout_ms ? duration(config.aligned_checkpoint_timeout_ms) : "none",
      ],
      [
        "Tolerable failed checkpoints",
        config.tolerable_failures_unlimited ? "unlimited" : config.tolerable_failures,
      ],
      ["Retained checkpoints", config.retained],
      ["Currently retained", data.retained_ids.join(", ") || "none"],
      ["Storage", config.storage_uri || "the coordinator's storage root"],
    ],
    { header: true },
  );
}

function historyRow(c, statusCell, status) {
  return {
    className:
      `status-row-${status.toLowerCase()}` +
      (String(c.checkpoint_id) === view.checkpointId ? " selected" : "") +
      (c.discarded ? " discarded" : ""),
    data: { checkpointId: c.checkpoint_id, status },
    onclick: () => go(view.jobId, "checkpoints", c.checkpoint_id),
    cells: [
      c.checkpoint_id,
      statusCell,
      enumName(c.kind).toLowerCase() + (c.unaligned ? " (unaligned)" : ""),
      `${c.num_acknowledged} / ${c.num_tasks}`,
      clock(c.trigger_timestamp_ms),
      clock(c.latest_ack_timestamp_ms),
      c.latest_ack_timestamp_ms ? duration(c.end_to_end_duration_ms) : "–",
      bytes(c.state_size_bytes),
      bytes(c.incremental_size_bytes),
      bytes(c.processed_during_alignment_bytes),
      bytes(c.persisted_in_flight_bytes),
      shortPath(c.external_path),
    ],
  };
}

function renderDetails(data) {
  $("checkpoint-details").hidden = !data;
  if (!data) return;
  $("details-id").textContent = `${data.summary.checkpoint_id}${data.summary.discarded ? " (discarded)" : ""}`;
  fill(
    "subtasks",
    data.subtasks.map((s) => {
      const m = s.metrics || {};
      return [
        s.attempt.vertex_id,
        s.attempt.subtask_index,
        s.attempt.attempt,
        s.acknowledged ? "yes" : "no",
        clock(s.ack_timestamp_ms),
        s.acknowledged ? duration(s.end_to_end_duration_ms) : "–",
        duration(m.sync_duration_ms),
        duration(m.async_duration_ms),
        duration(m.alignment_duration_ms),
        duration(m.start_delay_ms),
        bytes(m.state_size_bytes),
        s.acknowledged ? bytes(s.incremental_size_bytes) : "–",
        bytes(m.processed_during_alignment_bytes),
        bytes(m.persisted_in_flight_bytes),
        m.unaligned ? "yes" : "no",
      ];
    }),
  );
}

function showTab() {
  for (const name of ["overview", "checkpoints", "exceptions"]) {
    $(`tab-${name}`).classList.toggle("active", view.tab === name);
    $(`tab-link-${name}`).classList.toggle("active", view.tab === name);
  }
}

// --- the refresh loop ----------------------------------------------------------------------

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

async function refresh() {
  if (busy) {
    again = true;
    return;
  }
  busy = true;
  try {
    renderJobs(await api("/api/jobs"));
    $("job-section").hidden = !view.jobId;
    if (view.jobId) {
      const base = `/api/jobs/${encodeURIComponent(view.jobId)}`;
      const [job, checkpoints] = await Promise.all([api(base), api(`${base}/checkpoints`)]);
      renderJob(job);
      renderCheckpoints(checkpoints);
      let details = null;
      if (view.checkpointId) {
        const key = `${view.jobId}/${view.checkpointId}`;
        if (endedDetails && endedDetails.key === key) {
          details = endedDetails.data;
          const history = checkpoints.stats.history;
          const row = history.find((c) => String(c.checkpoint_id) === view.checkpointId);
          if (row) details.summary.discarded = row.discarded;
        } else {
          try {
            details = await api(`${base}/checkpoints/${encodeURIComponent(view.checkpointId)}`);
            if (enumName(details.summary.status) !== "IN_PROGRESS") {
              endedDetails = { key, data: details };
            }
          } catch (error) {
            if (error instanceof Unauthorized) throw error;
            showError(`Checkpoint ${view.checkpointId}: ${error.message}`);
          }
        }
      }
      renderDetails(details);
      showTab();
    }
    $("login").hidden = true;
    if (!view.checkpointId) showError("");
    $("refreshed").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.loaded = "true";
  } catch (error) {
    if (error instanceof Unauthorized) {
      $("login").hidden = false;
      showError(error.message);
    } else {
      showError(`Cannot reach the coordinator: ${error.message}`);
    }
  } finally {
    busy = false;
    if (again) {
      again = false;
      refresh();
    }
  }
}

function start() {
  for (const link of document.querySelectorAll(".tabs a")) {
    link.addEventListener("click", () => view.jobId && go(view.jobId, link.dataset.tab));
  }
  $("details-close").addEventListener("click", (event) => {
    event.preventDefault();
    go(view.jobId, "checkpoints");
  });
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    refresh();
  });
  window.addEventListener("hashchange", route);
  setInterval(() => {
    if (!document.hidden) refresh();
  }, REFRESH_MS);
  route();
}

document.addEventListener("DOMContentLoaded", start);

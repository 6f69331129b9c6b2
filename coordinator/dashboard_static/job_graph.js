// The job graph, drawn: vertices in columns by their longest path from a vertex without inputs
// (a source), so several sources, diamonds and joins read left to right; within a column,
// vertices sit near the average row of their inputs (fewer crossings). Edges are curves
// labelled with their partitioning, and with the target's input they feed when the target has
// several. Each vertex shows its parallelism and the highest busy and backpressured time of
// its subtasks. Plain SVG (svg.js), laid out here: no library.
"use strict";

const GRAPH = { nodeWidth: 220, nodeHeight: 70, columnGap: 130, rowGap: 34, margin: 14, spread: 14 };

// Columns (layers) and rows of the vertices: { layer: Map, row: Map, columns: [[id]] }.
function graphLayout(vertices, edges) {
  const ids = vertices.map((v) => v.vertex_id);
  const preds = new Map(ids.map((id) => [id, []]));
  const succs = new Map(ids.map((id) => [id, []]));
  for (const e of edges) {
    if (!preds.has(e.target_vertex_id) || !succs.has(e.source_vertex_id)) continue;
    preds.get(e.target_vertex_id).push(e.source_vertex_id);
    succs.get(e.source_vertex_id).push(e.target_vertex_id);
  }
  // Longest path from the vertices without inputs, in topological order (Kahn).
  const layer = new Map();
  const waiting = new Map(ids.map((id) => [id, preds.get(id).length]));
  const ready = ids.filter((id) => waiting.get(id) === 0);
  for (const id of ready) layer.set(id, 0);
  for (let i = 0; i < ready.length; i += 1) {
    const id = ready[i];
    for (const next of succs.get(id)) {
      layer.set(next, Math.max(layer.get(next) || 0, layer.get(id) + 1));
      waiting.set(next, waiting.get(next) - 1);
      if (waiting.get(next) === 0) ready.push(next);
    }
  }
  // A cycle (the coordinator refuses them) would leave vertices unplaced: after the rest.
  const deepest = Math.max(0, ...layer.values());
  for (const id of ids) if (ready.indexOf(id) < 0) layer.set(id, deepest + 1);
  const columns = [];
  for (const id of ids) {
    const l = layer.get(id);
    while (columns.length <= l) columns.push([]);
    columns[l].push(id);
  }
  const row = new Map();
  columns.forEach((column, c) => {
    if (c > 0) {
      const at = (id) => {
        const placed = preds.get(id).filter((p) => row.has(p));
        return placed.length ? placed.reduce((s, p) => s + row.get(p), 0) / placed.length : 1e9;
      };
      column = column
        .map((id, k) => [at(id), k, id])
        .sort((a, b) => a[0] - b[0] || a[1] - b[1])
        .map((entry) => entry[2]);
      columns[c] = column;
    }
    column.forEach((id, k) => row.set(id, k));
  });
  return { layer, row, columns };
}

// The highest busy and backpressured time (ms per second) of each vertex's subtasks.
function vertexLoad(tasks) {
  const load = new Map();
  for (const t of tasks) {
    if (!t.metrics) continue;
    const id = t.attempt.vertex_id;
    const seen = load.get(id) || { busy: 0, backpressured: 0 };
    seen.busy = Math.max(seen.busy, t.metrics.busy_ms_per_second || 0);
    seen.backpressured = Math.max(seen.backpressured, t.metrics.backpressured_ms_per_second || 0);
    load.set(id, seen);
  }
  return load;
}

function loadClass(load) {
  if (!load) return "load-none";
  if (load.backpressured >= 500) return "load-backpressured";
  if (load.busy >= 500) return "load-busy";
  return "load-ok";
}

function groupBy(items, key) {
  const groups = new Map();
  for (const item of items) {
    if (!groups.has(key(item))) groups.set(key(item), []);
    groups.get(key(item)).push(item);
  }
  return groups;
}

function percent(msPerSecond) {
  return `${Math.round((msPerSecond || 0) / 10)}%`;
}

function clip(text, chars) {
  text = String(text || "");
  return text.length > chars ? `${text.slice(0, chars - 1)}…` : text;
}

// Draw ``graph`` (the API's JobGraph) with the load of ``tasks`` into the element ``id``.
function renderGraph(id, graph, tasks) {
  const host = document.getElementById(id);
  const vertices = graph.vertices || [];
  const edges = (graph.edges || []).filter(
    (e) =>
      vertices.some((v) => v.vertex_id === e.source_vertex_id) &&
      vertices.some((v) => v.vertex_id === e.target_vertex_id),
  );
  const load = vertexLoad(tasks);
  // Drawn again only when something shown changed (a hover's tooltip survives the refresh).
  const signature = JSON.stringify([vertices, edges, [...load]]);
  if (host.dataset.signature === signature) return;
  host.dataset.signature = signature;
  const { layer, row, columns } = graphLayout(vertices, edges);
  const g = GRAPH;
  const tallest = Math.max(1, ...columns.map((c) => c.length));
  const height = g.margin * 2 + tallest * g.nodeHeight + (tallest - 1) * g.rowGap;
  const width = g.margin * 2 + columns.length * g.nodeWidth + (columns.length - 1) * g.columnGap;
  const at = new Map();
  for (const v of vertices) {
    const l = layer.get(v.vertex_id);
    const n = columns[l].length;
    const top = (height - (n * g.nodeHeight + (n - 1) * g.rowGap)) / 2;
    at.set(v.vertex_id, {
      x: g.margin + l * (g.nodeWidth + g.columnGap),
      y: top + row.get(v.vertex_id) * (g.nodeHeight + g.rowGap),
    });
  }
  const svg = svgEl("svg", {
    class: "job-graph",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    "aria-label": `job graph: ${vertices.length} vertices, ${edges.length} edges`,
  });
  const defs = svgEl("defs");
  const marker = svgEl("marker", {
    id: "graph-arrow",
    viewBox: "0 0 10 10",
    refX: 10,
    refY: 5,
    markerWidth: 7,
    markerHeight: 7,
    orient: "auto-start-reverse",
  });
  marker.appendChild(svgEl("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "graph-arrow" }));
  defs.appendChild(marker);
  svg.appendChild(defs);

  // Edges: spread where several leave or enter one vertex (a fan-out, a join).
  const outgoing = groupBy(edges, (e) => e.source_vertex_id);
  const incoming = groupBy(edges, (e) => e.target_vertex_id);
  const offset = (list, e) => (list.indexOf(e) - (list.length - 1) / 2) * g.spread;
  for (const e of edges) {
    const from = at.get(e.source_vertex_id);
    const to = at.get(e.target_vertex_id);
    const x1 = from.x + g.nodeWidth;
    const y1 = from.y + g.nodeHeight / 2 + offset(outgoing.get(e.source_vertex_id), e);
    const x2 = to.x;
    const y2 = to.y + g.nodeHeight / 2 + offset(incoming.get(e.target_vertex_id), e);
    const bend = Math.max(40, (x2 - x1) / 2);
    const group = svgEl("g", {
      class: "graph-edge",
      "data-source": e.source_vertex_id,
      "data-target": e.target_vertex_id,
    });
    group.appendChild(
      svgEl("path", {
        d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`,
        "marker-end": "url(#graph-arrow)",
      }),
    );
    let label = enumName(e.partitioner);
    if (e.key_field) label += ` (${e.key_field})`;
    const joins = incoming.get(e.target_vertex_id).length > 1;
    if (joins && e.target_input !== undefined) label += ` → input ${e.target_input}`;
    group.appendChild(
      svgEl("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 5, "text-anchor": "middle" }, label),
    );
    svgTitle(group, `${e.source_vertex_id} → ${e.target_vertex_id}: ${label}`);
    svg.appendChild(group);
  }

  for (const v of vertices) {
    const { x, y } = at.get(v.vertex_id);
    const vertexLoadNow = load.get(v.vertex_id);
    const node = svgEl("g", {
      class: `graph-node ${loadClass(vertexLoadNow)}${v.is_source ? " source" : ""}`,
      transform: `translate(${x} ${y})`,
      "data-vertex-id": v.vertex_id,
      "data-layer": layer.get(v.vertex_id),
    });
    node.appendChild(svgEl("rect", { width: g.nodeWidth, height: g.nodeHeight, rx: 6 }));
    node.appendChild(svgEl("text", { x: 10, y: 20, class: "name" }, clip(v.name || v.vertex_id, 28)));
    node.appendChild(
      svgEl("text", { x: 10, y: 39, class: "detail" }, clip(`${v.vertex_id} · parallelism ${v.parallelism}`, 34)),
    );
    const metrics = vertexLoadNow
      ? `busy ${percent(vertexLoadNow.busy)} · backpressured ${percent(vertexLoadNow.backpressured)}`
      : "no metrics yet";
    node.appendChild(svgEl("text", { x: 10, y: 58, class: "load" }, metrics));
    const operators = (v.operators || []).map((o) => `${o.name || o.operator_id} (${o.kind})`);
    svgTitle(node, `${v.name} [${v.vertex_id}]\n${operators.join(" → ")}\n${metrics} (highest of its subtasks)`);
    svg.appendChild(node);
  }
  host.replaceChildren(svg);
}

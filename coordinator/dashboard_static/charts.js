// Line charts of the completed checkpoints over time (SVG, svg.js): one value or several
// series per checkpoint, the checkpoint id along the x axis, zero at the bottom of the y axis.
"use strict";

const CHART = { width: 440, height: 190, left: 70, right: 14, top: 14, bottom: 30 };

// A round upper bound for the y axis: 1, 2 or 5 times a power of ten.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

// Draw into the element ``id`` (its <svg> replaced): ``series`` is a list of
// { name, className, points: [{ id, value }] }, ``format`` turns a value into a label.
function renderLineChart(id, series, format) {
  const c = CHART;
  const figure = document.getElementById(id);
  const all = series.flatMap((s) => s.points);
  const svg = svgEl("svg", {
    class: "chart",
    width: c.width,
    height: c.height,
    viewBox: `0 0 ${c.width} ${c.height}`,
    "data-points": series.length ? series[0].points.length : 0,
  });
  const old = figure.querySelector("svg");
  if (old) old.replaceWith(svg);
  else figure.appendChild(svg);
  if (all.length === 0) {
    svg.appendChild(
      svgEl("text", { x: c.width / 2, y: c.height / 2, "text-anchor": "middle", class: "empty" },
        "No completed checkpoints yet"),
    );
    return;
  }
  const ids = all.map((p) => Number(p.id));
  const low = Math.min(...ids);
  const high = Math.max(...ids);
  const top = niceMax(Math.max(...all.map((p) => Number(p.value))));
  const plotW = c.width - c.left - c.right;
  const plotH = c.height - c.top - c.bottom;
  const x = (checkpointId) =>
    high === low ? c.left + plotW / 2 : c.left + ((checkpointId - low) / (high - low)) * plotW;
  const y = (value) => c.top + plotH - (value / top) * plotH;

  for (const fraction of [0, 0.5, 1]) {
    const gy = y(top * fraction);
    svg.appendChild(svgEl("line", { x1: c.left, x2: c.width - c.right, y1: gy, y2: gy, class: "grid" }));
    svg.appendChild(
      svgEl("text", { x: c.left - 6, y: gy + 4, "text-anchor": "end", class: "axis" }, format(top * fraction)),
    );
  }
  const labels = high === low ? [low] : [low, high];
  for (const checkpointId of labels) {
    svg.appendChild(
      svgEl("text", { x: x(checkpointId), y: c.height - 10, "text-anchor": "middle", class: "axis" }, `#${checkpointId}`),
    );
  }
  for (const s of series) {
    const group = svgEl("g", { class: `series ${s.className}`, "data-series": s.name });
    const points = s.points.map((p) => `${x(Number(p.id))},${y(Number(p.value))}`).join(" ");
    group.appendChild(svgEl("polyline", { points }));
    for (const p of s.points) {
      const dot = svgEl("circle", {
        cx: x(Number(p.id)),
        cy: y(Number(p.value)),
        r: 3,
        "data-checkpoint-id": p.id,
        "data-value": p.value,
      });
      svgTitle(dot, `checkpoint ${p.id}: ${s.name} ${format(p.value)}`);
      group.appendChild(dot);
    }
    svg.appendChild(group);
  }
}

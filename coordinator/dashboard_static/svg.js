// SVG elements for the dashboard's drawings (the job graph, the checkpoint charts). Text goes
// in through textContent and attributes through setAttribute: nothing is parsed as markup, and
// no style attribute is set (the page's Content-Security-Policy allows only its stylesheet).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(name, String(value));
  }
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// A <title> child: the tooltip a browser shows over an SVG element.
function svgTitle(node, text) {
  node.appendChild(svgEl("title", {}, text));
  return node;
}

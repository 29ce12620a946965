// multihead head view: layer x head grid, attention lines of a hovered token, a clicked head's
// roles, metrics and syntax scores. No network, no library: this file and common.js.
window.MultiheadHeadView = window.MultiheadHeadView || (function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const THUMB = 40;  // thumbnail side in pixels: keys and queries max-pooled down to it

  const {unpack, el} = window.MultiheadCommon;  // common.js, inlined before this file

  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }

  async function render(D) {
    const root = document.getElementById(D.id);
    const $ = (suffix) => document.getElementById(`${D.id}-${suffix}`);
    const L = D.L, H = D.H, T = D.tokens.length;
    let W;
    try {
      W = await unpack(D.weights, L * H * T * T, D.unit);
    } catch (e) {
      $("details").textContent = "This browser cannot read the view's weights: " + e;
      console.error(e);
      return;
    }
    const weight = (l, h, q, k) => W[((l * H + h) * T + q) * T + k];
    const state = {layer: D.open[0], head: D.open[1], hover: null};

    // Grid: one max-pooled thumbnail per head; keys a causal head cannot see painted grey.
    const grid = $("grid");
    grid.style.gridTemplateColumns = `auto repeat(${H}, auto)`;
    grid.appendChild(el("span", "mhv-axis", ""));
    for (let h = 0; h < H; h++) grid.appendChild(el("span", "mhv-axis", `H${h}`));
    const S = Math.min(T, THUMB), cells = [];
    for (let l = 0; l < L; l++) {
      grid.appendChild(el("span", "mhv-axis", `L${l}`));
      for (let h = 0; h < H; h++) {
        const cell = el("div", "mhv-cell");
        cell.dataset.layer = l;
        cell.dataset.head = h;
        cell.title = `layer ${l}, head ${h}`;
        const c = el("canvas");
        c.width = c.height = S;
        const ctx = c.getContext("2d"), img = ctx.createImageData(S, S);
        for (let a = 0; a < S; a++) {
          const q0 = Math.floor(a * T / S), q1 = Math.floor((a + 1) * T / S);
          for (let b = 0; b < S; b++) {
            const k0 = Math.floor(b * T / S), k1 = Math.floor((b + 1) * T / S);
            const p = 4 * (a * S + b);
            img.data[p + 3] = 255;
            if (D.causal && k0 > q1 - 1) {  // every key of the block lies after every query
              img.data[p] = img.data[p + 1] = img.data[p + 2] = 200;
              continue;
            }
            let m = 0;
            for (let q = q0; q < q1; q++) for (let k = k0; k < k1; k++) m = Math.max(m, weight(l, h, q, k));
            const v = Math.min(1, Math.sqrt(m));  // sqrt: small weights stay visible
            img.data[p] = 255 - 225 * v;
            img.data[p + 1] = 255 - 160 * v;
            img.data[p + 2] = 255 - 40 * v;
          }
        }
        ctx.putImageData(img, 0, 0);
        cell.appendChild(c);
        cell.addEventListener("click", () => { state.layer = l; state.head = h; select(); });
        grid.appendChild(cell);
        cells.push(cell);
      }
    }

    // Token view: queries on the left, keys on the right, a line per (query, key) weight.
    const svg = $("svg");
    const row = Math.max(11, Math.min(18, Math.floor(640 / T)));
    const width = 330, xq = 120, xk = 210;
    svg.setAttribute("width", width);
    svg.setAttribute("height", 12 + row * T);
    const y = (i) => 12 + row * i;
    const lines = svgEl("g", {});
    svg.appendChild(lines);
    const left = [], right = [];
    D.tokens.forEach((tok, i) => {
      const a = svgEl("text", {x: xq - 6, y: y(i) + 4, "text-anchor": "end", "data-index": i});
      a.textContent = tok;
      a.classList.add("mhv-query");
      a.addEventListener("mouseenter", () => { state.hover = i; drawLines(); });
      a.addEventListener("mouseleave", () => { state.hover = null; drawLines(); });
      const b = svgEl("text", {x: xk + 6, y: y(i) + 4, "text-anchor": "start", "data-index": i});
      b.textContent = tok;
      b.classList.add("mhv-key");
      svg.appendChild(a);
      svg.appendChild(b);
      left.push(a);
      right.push(b);
    });

    function drawLines() {
      lines.textContent = "";
      const {layer: l, head: h, hover} = state;
      // All queries: lines of weight >= 0.1; one hovered query: every line of weight >= 0.01.
      const queries = hover === null ? [...Array(T).keys()] : [hover];
      const floor = hover === null ? 0.1 : 0.01;
      for (const q of queries) {
        for (let k = 0; k < T; k++) {
          const w = weight(l, h, q, k);
          if (w < floor) continue;
          lines.appendChild(svgEl("line", {
            x1: xq, y1: y(q), x2: xk, y2: y(k), "stroke-width": 2,
            "stroke-opacity": Math.min(1, 0.15 + w).toFixed(3), "data-q": q, "data-k": k,
          }));
        }
      }
      left.forEach((t, i) => t.classList.toggle("mhv-hover", i === hover));
      right.forEach((t, k) => t.classList.toggle("mhv-future", D.causal && hover !== null && k > hover));
    }

    function fmt(v) { return typeof v === "number" ? v.toFixed(2) : String(v); }

    function details() {
      const box = $("details"), {layer: l, head: h} = state;
      box.textContent = "";
      box.appendChild(el("h3", "", `Layer ${l}, head ${h}`));
      const roles = D.roles[l][h];
      box.appendChild(el("b", "", "Measured roles"));
      if (roles.length) {
        const ul = el("ul", "mhv-roles");
        for (const r of roles) ul.appendChild(el("li", "", `${r.role} (${fmt(r.strength)}x): ${r.text}`));
        box.appendChild(ul);
      } else {
        box.appendChild(el("p", "mhv-roles", "none passes its threshold on this text"));
      }
      const names = D.metric_names;
      if (names.length) {
        box.appendChild(el("b", "", "Metrics on this text"));
        const table = el("table", "mhv-metrics");
        for (const m of names) {
          const tr = el("tr");
          tr.appendChild(el("td", "", m));
          const cell = el("td", "", m in D.undefined ? "n/a" : fmt(D.metrics[m][l][h]));
          if (m in D.undefined) cell.title = D.undefined[m];  // why it is not defined here
          tr.appendChild(cell);
          table.appendChild(tr);
        }
        box.appendChild(table);
      }
      const syntax = D.syntax[`${l},${h}`];
      box.appendChild(el("b", "", "Syntax scores"));
      if (syntax) {
        const table = el("table", "mhv-syntax");
        const entries = Object.entries(syntax).sort((a, b) => b[1] - a[1]);
        for (const [rel, acc] of entries) {
          const tr = el("tr");
          tr.appendChild(el("td", "", rel));
          tr.appendChild(el("td", "", fmt(acc)));
          table.appendChild(tr);
        }
        box.appendChild(table);
      } else {
        const none = Object.keys(D.syntax).length ? "none for this head" : "no annotations given (show(..., syntax=...))";
        box.appendChild(el("p", "mhv-syntax-none", none));
      }
      if (D.causal) box.appendChild(el("p", "mhv-hint", "causal: a token attends to itself and earlier tokens only; later keys are greyed"));
    }

    function select() {
      cells.forEach((c) => c.classList.toggle("mhv-selected",
        +c.dataset.layer === state.layer && +c.dataset.head === state.head));
      drawLines();
      details();
    }

    select();
    root.dataset.ready = "1";
  }

  return {render};
})();

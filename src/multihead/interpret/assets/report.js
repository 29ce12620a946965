// multihead attention report: renders one data object into one container. No network, no deps.
// Weights arrive deflated (see report_html.pack_weights); the page inflates them, draws every
// head as a max-pooled thumbnail (sharp patterns keep their contrast at any length) and opens
// one head's labelled heatmap and line view. In a causal report (D.causal) the upper triangle,
// keys after the query that a causal head cannot see, is painted grey, never as weight 0.
(function () {
  "use strict";
  // role -> [short badge text, colour]
  const ROLES = {"previous-token": ["prev", "#2f6fde"], "next-token": ["next", "#7a4fd6"],
    "self": ["self", "#0f8b8d"], "positional": ["pos", "#c2410c"],
    "special-token sink": ["sink", "#6b7280"], "punctuation": ["punct", "#b45309"],
    "duplicate-token": ["dup", "#15803d"], "induction": ["ind", "#be123c"],
    "broad": ["broad", "#0e7490"]};
  const THUMB = 48;      // thumbnail pixels per side (at most)
  const LINES_TOP = 4;   // line view: each query's strongest keys...
  const LINES_MIN = 0.01;  // ...with at least this weight

  // colour of a weight: sqrt scale so small weights stay visible; a 256-entry lookup table
  const LUT = new Uint8ClampedArray(256 * 3);
  for (let k = 0; k < 256; k++) {
    const s = k / 255;
    LUT[3 * k] = 255 - 225 * s; LUT[3 * k + 1] = 255 - 170 * s; LUT[3 * k + 2] = 255 - 40 * s;
  }
  const lut = (w) => 3 * Math.min(255, Math.max(0, Math.round(Math.sqrt(w) * 255)));
  const FUTURE = [222, 222, 222];  // a key after the query in a causal pattern: not attended

  const {unpack, el} = window.MultiheadCommon;  // common.js, inlined before this file

  // The RGB of a cell: its weight's colour, or grey for a key a causal query cannot see.
  function rgb(w, future) {
    if (future) return FUTURE;
    const c = lut(w);
    return [LUT[c], LUT[c + 1], LUT[c + 2]];
  }

  // Paint a T x T matrix, `scale` pixels per cell; `causal`: grey above the diagonal.
  function paint(canvas, M, T, scale, causal) {
    canvas.width = T * scale; canvas.height = T * scale;
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(T * scale, T * scale);
    const px = img.data, W = T * scale;
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
      const c = rgb(M[i * T + j], causal && j > i);
      for (let y = i * scale; y < (i + 1) * scale; y++) for (let x = j * scale; x < (j + 1) * scale; x++) {
        const p = 4 * (y * W + x);
        px[p] = c[0]; px[p + 1] = c[1]; px[p + 2] = c[2]; px[p + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  // A thumbnail of at most THUMB x THUMB pixels; each pixel shows the largest weight it covers
  // (grey when every cell it covers lies above a causal diagonal).
  function thumbnail(canvas, M, T, causal) {
    const S = Math.max(1, Math.min(T, THUMB));
    canvas.width = S; canvas.height = S;
    const ctx = canvas.getContext("2d"), img = ctx.createImageData(S, S), px = img.data;
    for (let a = 0; a < S; a++) for (let b = 0; b < S; b++) {
      let m = 0;
      const i0 = Math.floor(a * T / S), i1 = Math.floor((a + 1) * T / S);
      const j0 = Math.floor(b * T / S), j1 = Math.floor((b + 1) * T / S);
      for (let i = i0; i < i1; i++) for (let j = j0; j < j1; j++) m = Math.max(m, M[i * T + j]);
      const c = rgb(m, causal && j0 > i1 - 1), p = 4 * (a * S + b);
      px[p] = c[0]; px[p + 1] = c[1]; px[p + 2] = c[2]; px[p + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  async function render(D) {
    const root = document.getElementById(D.id);
    const $ = (s) => root.querySelector("#" + D.id + "-" + s);
    const L = D.L, H = D.H, T0 = D.tokens.length;
    const state = {hideSpecial: false, merge: false, layer: null, head: null, lock: null};
    const undefinedMetric = D.undefined || {};
    let W;
    try {
      W = await unpack(D.weights, L * H * T0 * T0, D.unit);
    } catch (e) {
      $("title").textContent = "This browser cannot read the report's weights: " + e;
      console.error(e);
      return;
    }

    // The (possibly transformed) view of one head: tokens and a row-stochastic T x T matrix.
    // A causal pattern stays lower-triangular under both transformations (order is kept).
    function view(l, h) {
      let toks = D.tokens.map((t, i) => ({text: t, idx: [i], special: D.special[i]}));
      let T = T0, M = W.subarray((l * H + h) * T0 * T0, (l * H + h + 1) * T0 * T0);
      if (state.merge) {  // word pieces -> words: sum over key pieces, mean over query pieces
        const words = [];
        toks.forEach((t, i) => {
          if (!D.word_starts[i] && words.length) {
            const w = words[words.length - 1];
            w.text += t.text.startsWith("##") ? t.text.slice(2) : t.text; w.idx.push(i);
          } else words.push({text: t.text, idx: [i], special: t.special});
        });
        const N = words.length, out = new Float32Array(N * N);
        words.forEach((q, a) => words.forEach((k, b) => {
          let s = 0;
          q.idx.forEach((i) => k.idx.forEach((j) => { s += M[i * T + j]; }));
          out[a * N + b] = s / q.idx.length;
        }));
        toks = words; M = out; T = N;
      }
      if (state.hideSpecial) {  // drop special rows/columns and renormalise rows
        const keep = toks.map((t, i) => t.special ? -1 : i).filter((i) => i >= 0);
        const N = keep.length, out = new Float32Array(N * N);
        keep.forEach((i, a) => {
          let s = 0;
          keep.forEach((j) => { s += M[i * T + j]; });
          keep.forEach((j, b) => { out[a * N + b] = s > 0 ? M[i * T + j] / s : 0; });
        });
        toks = keep.map((i) => toks[i]); M = out; T = N;
      }
      return {tokens: toks.map((t) => t.text), M, T};
    }

    // The badge: the strongest role measured on the text, else the probe's.
    function badgeRole(l, h) {
      const roles = D.roles[l][h];
      return roles.find((r) => r.source === "text") || roles[0] || null;
    }
    function describe(r) {
      return `${r.role} head: ${r.text}` + (r.source === "probe" ? " (on repeated random tokens)" : "");
    }
    function summary(l, h) {
      const roles = D.roles[l][h];
      return roles.length ? roles.map(describe).join("; ") : "no clear role";
    }

    function grid() {
      const g = $("grid");
      g.style.gridTemplateColumns = `repeat(${H}, minmax(40px, 56px))`;
      g.innerHTML = "";
      for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
        const cell = el("div", "mh-cell");
        cell.id = D.id + `-cell-${l}-${h}`;
        cell.dataset.layer = l; cell.dataset.head = h;
        cell.title = `L${l} H${h}: ` + summary(l, h);
        const c = el("canvas");
        cell.append(c, el("div", "mh-lab", `L${l} H${h}`));
        const r = badgeRole(l, h);
        if (r) {
          const [short, colour] = ROLES[r.role] || [r.role, "#888"];
          const b = el("span", "mh-badge" + (r.source === "probe" ? " mh-probe" : ""), short);
          b.style.setProperty("--c", colour);
          cell.append(b);
        }
        cell.addEventListener("click", () => open(l, h));
        g.append(cell);
      }
      thumbnails();
    }
    function thumbnails() {
      root.querySelectorAll(".mh-cell").forEach((cell) => {
        const v = view(+cell.dataset.layer, +cell.dataset.head);
        thumbnail(cell.querySelector("canvas"), v.M, v.T, D.causal);
      });
    }

    function legend() {
      const used = new Set(D.roles.flat(2).map((r) => r.role));
      const leg = $("legend");
      leg.append("roles: ");
      Object.entries(ROLES).filter(([role]) => used.has(role)).forEach(([role, [short, colour]]) => {
        const b = el("span", "mh-badge", short);
        b.style.setProperty("--c", colour); b.title = role;
        leg.append(b, ` ${role}  `);
      });
      const p = el("span", "mh-badge mh-probe", "dashed");
      p.style.setProperty("--c", "#666");
      leg.append(p, " measured on repeated random tokens" + (D.probe ? ` (${D.probe})` : ""));
      if (D.causal) {
        const g = el("span", "mh-badge mh-future", "grey");
        leg.append("  ", g, " later keys: a causal head cannot attend to them");
      }
    }

    const tip = $("tip");
    function showTip(e, text) {
      tip.textContent = text; tip.style.display = "block";
      tip.style.left = e.clientX + 12 + "px"; tip.style.top = e.clientY + 12 + "px";
    }
    function hideTip() { tip.style.display = "none"; }

    function open(l, h) {
      state.layer = l; state.head = h; state.lock = null;
      root.querySelectorAll(".mh-cell.mh-sel").forEach((c) => c.classList.remove("mh-sel"));
      $(`cell-${l}-${h}`).classList.add("mh-sel");
      $("title").textContent = `Layer ${l}, head ${h}: ` + summary(l, h);
      const v = view(l, h);
      heatmap(v);
      lines(v);
    }

    // The heatmap with token labels on both axes (every `stride`-th when long), in its own
    // scrolling box; the labels stay in view while it scrolls.
    function heatmap(v) {
      const T = v.T, scale = Math.max(5, Math.min(22, Math.floor(520 / Math.max(T, 1))));
      const stride = Math.ceil(12 / scale);
      const box = $("heatbox");
      box.innerHTML = "";
      const g = el("div", "mh-heatgrid");
      g.style.gridTemplateColumns = `max-content ${T * scale}px`;
      g.style.gridTemplateRows = `max-content ${T * scale}px`;
      const corner = el("div", "mh-corner", "keys →\nqueries ↓" + (stride > 1 ? `\n(1 in ${stride} labelled)` : ""));
      const xl = el("div", "mh-xlab"), yl = el("div", "mh-ylab");
      xl.id = D.id + "-xlab"; yl.id = D.id + "-ylab";
      v.tokens.forEach((t, i) => {
        const text = i % stride === 0 ? t : "";
        const x = el("span", "", text), y = el("span", "", text);
        x.style.width = scale + "px"; x.style.lineHeight = scale + "px";
        y.style.height = scale + "px"; y.style.lineHeight = scale + "px";
        xl.append(x); yl.append(y);
      });
      const c = el("canvas");
      c.id = D.id + "-heat";
      paint(c, v.M, T, scale, D.causal);
      c.onmousemove = (e) => {
        const i = Math.floor(e.offsetY / scale), j = Math.floor(e.offsetX / scale);
        if (i >= 0 && j >= 0 && i < T && j < T) {
          const what = D.causal && j > i ? "after the query: not attended (causal)" : v.M[i * T + j].toFixed(4);
          showTip(e, `query ${i} ${v.tokens[i]} → key ${j} ${v.tokens[j]}: ${what}`);
        }
      };
      c.onmouseleave = hideTip;
      g.append(corner, xl, yl, c);
      box.append(g);
    }

    function colourScale() {
      const s = $("scale"), width = 200;
      const c = el("canvas");
      c.width = width; c.height = 10;
      const ctx = c.getContext("2d");
      for (let x = 0; x < width; x++) {
        const k = 3 * Math.round(x / (width - 1) * 255);
        ctx.fillStyle = `rgb(${LUT[k]},${LUT[k + 1]},${LUT[k + 2]})`;
        ctx.fillRect(x, 0, 1, 10);
      }
      const ticks = el("div", "mh-ticks");
      ticks.style.width = width + "px";
      [0, 0.01, 0.05, 0.25, 0.5, 1].forEach((w) => {
        const t = el("span", "", String(w));
        t.style.left = Math.sqrt(w) * width + "px";
        ticks.append(t);
      });
      const wrap = el("div", "mh-scalewrap");
      wrap.append(c, ticks);
      s.append(el("span", "", "weight"), wrap, el("span", "", "colour ∝ √weight: small weights stay visible"));
    }

    function lines(v) {
      const T = v.T, svg = $("lines"), rowH = 16, width = 340;
      svg.setAttribute("width", width); svg.setAttribute("height", T * rowH + 10);
      const ns = "http://www.w3.org/2000/svg";
      svg.innerHTML = "";
      const edges = [];
      for (let i = 0; i < T; i++) {
        const row = [];
        for (let j = 0; j < T; j++) if (v.M[i * T + j] >= LINES_MIN) row.push(j);
        row.sort((a, b) => v.M[i * T + b] - v.M[i * T + a]);
        for (const j of row.slice(0, LINES_TOP)) {
          const p = document.createElementNS(ns, "line");
          p.setAttribute("x1", 110); p.setAttribute("y1", i * rowH + 12);
          p.setAttribute("x2", width - 110); p.setAttribute("y2", j * rowH + 12);
          p.setAttribute("stroke", "#2f6fde"); p.setAttribute("stroke-width", 2);
          p.setAttribute("stroke-opacity", Math.sqrt(v.M[i * T + j]));
          p.dataset.from = i; p.dataset.to = j;
          svg.append(p); edges.push(p);
        }
      }
      function filter(i) {
        edges.forEach((e) => { e.style.display = (i === null || +e.dataset.from === i) ? "" : "none"; });
      }
      v.tokens.forEach((t, i) => {
        for (const side of ["left", "right"]) {
          const tx = document.createElementNS(ns, "text");
          tx.setAttribute("x", side === "left" ? 105 : width - 105);
          tx.setAttribute("y", i * rowH + 16);
          tx.setAttribute("text-anchor", side === "left" ? "end" : "start");
          tx.textContent = t;
          if (side === "left") {
            tx.addEventListener("mouseenter", () => { if (state.lock === null) filter(i); });
            tx.addEventListener("mouseleave", () => { if (state.lock === null) filter(null); });
            tx.addEventListener("click", () => {
              state.lock = state.lock === i ? null : i; filter(state.lock);
            });
          }
          svg.append(tx);
        }
      });
    }

    function table() {
      const names = D.metric_names, rows = [];
      for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
        const r = badgeRole(l, h);
        rows.push({head: `L${l} H${h}`, l, h, role: r ? r.role : "", ...Object.fromEntries(names.map((n) => [n, n in undefinedMetric ? "n/a" : D.metrics[n][l][h]]))});
      }
      let sortKey = "head", desc = false;
      const roleSel = $("role"), tableEl = $("table");
      function draw() {
        const want = roleSel.value;
        let shown = rows.filter((r) => !want || D.roles[r.l][r.h].some((x) => x.role === want));
        shown = shown.slice().sort((a, b) => {
          const x = a[sortKey], y = b[sortKey];
          const c = typeof x === "number" ? x - y : (sortKey === "head" ? (a.l - b.l) || (a.h - b.h) : String(x).localeCompare(String(y)));
          return desc ? -c : c;
        });
        const cols = ["head", "role", ...names];
        const esc = (x) => String(x).replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
        const cell = (c, x) => typeof x !== "number" ? esc(x) : (/_(offset|distance)$/.test(c) ? x.toFixed(0) : x.toFixed(3));
        const why = (c) => c in undefinedMetric ? ` title="n/a: ${esc(undefinedMetric[c])}"` : "";
        tableEl.innerHTML = "<thead><tr>" + cols.map((c) => `<th data-k="${esc(c)}"${why(c)}>${esc(c)}${c === sortKey ? (desc ? " ▼" : " ▲") : ""}</th>`).join("") +
          "</tr></thead><tbody>" + shown.map((r) => "<tr>" + cols.map((c) => `<td${why(c)}>${cell(c, r[c])}</td>`).join("") + "</tr>").join("") + "</tbody>";
        tableEl.querySelectorAll("th").forEach((th) => th.addEventListener("click", () => {
          const k = th.dataset.k; desc = sortKey === k ? !desc : typeof rows[0][k] === "number"; sortKey = k; draw();
        }));
      }
      const roles = [...new Set(D.roles.flat(2).map((r) => r.role))].sort();
      roleSel.innerHTML = `<option value="">all heads</option>` + roles.map((r) => `<option value="${r.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`)}">top heads: ${r.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`)}</option>`).join("");
      roleSel.addEventListener("change", () => {
        const r = roleSel.value;
        if (r) { const rule = D.role_metric[r]; if (rule) { sortKey = rule; desc = true; } }
        draw();
      });
      draw();
    }

    $("special").addEventListener("change", (e) => { state.hideSpecial = e.target.checked; refresh(); });
    $("merge").addEventListener("change", (e) => { state.merge = e.target.checked; refresh(); });
    function refresh() { thumbnails(); if (state.layer !== null) open(state.layer, state.head); }
    legend(); grid(); colourScale(); table();
    open(D.open[0], D.open[1]);
    root.dataset.ready = "1";
  }

  window.MultiheadReport = {render};
})();

// multihead attention report: renders one data object into one container. No network, no deps.
(function () {
  "use strict";
  const ROLE_COLORS = {"previous-token": "#2f6fde", "next-token": "#7a4fd6", "self": "#0f8b8d",
    "positional": "#c2410c", "special-token sink": "#6b7280", "punctuation": "#b45309",
    "duplicate-token": "#15803d", "induction": "#be123c", "broad": "#0e7490"};

  function decode(b64, n) {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const u16 = new Uint16Array(bytes.buffer), out = new Float32Array(n);
    for (let i = 0; i < n; i++) out[i] = u16[i] / 65535;
    return out;
  }

  function render(D) {
    const root = document.getElementById(D.id);
    const $ = (s) => root.querySelector(s);
    const id = (s) => D.id + "-" + s;
    const L = D.L, H = D.H, T0 = D.tokens.length;
    const W = decode(D.weights, L * H * T0 * T0);
    const state = {hideSpecial: false, merge: false, layer: null, head: null, lock: null};
    const special = new Set(D.special);

    // The (possibly transformed) view of one head: tokens and a row-stochastic T x T matrix.
    function view(l, h) {
      let toks = D.tokens.map((t, i) => ({text: t, idx: [i]}));
      const base = (l * H + h) * T0 * T0;
      let M = toks.map((_, i) => toks.map((_, j) => W[base + i * T0 + j]));
      if (state.merge) {  // word pieces -> words: sum over key pieces, mean over query pieces
        const words = [];
        toks.forEach((t, i) => {
          if (t.text.startsWith("##") && words.length) {
            const w = words[words.length - 1];
            w.text += t.text.slice(2); w.idx.push(i);
          } else words.push({text: t.text, idx: [i]});
        });
        M = words.map((q) => words.map((k) => {
          let s = 0; q.idx.forEach((i) => k.idx.forEach((j) => { s += M[i][j]; }));
          return s / q.idx.length;
        }));
        toks = words;
      }
      if (state.hideSpecial) {  // drop special rows/columns and renormalise rows
        const keep = toks.map((t, i) => special.has(t.text) ? -1 : i).filter((i) => i >= 0);
        M = keep.map((i) => {
          const row = keep.map((j) => M[i][j]);
          const s = row.reduce((a, b) => a + b, 0);
          return row.map((x) => s > 0 ? x / s : 0);
        });
        toks = keep.map((i) => toks[i]);
      }
      return {tokens: toks.map((t) => t.text), M};
    }

    function paint(canvas, M, scale) {
      const T = M.length;
      canvas.width = T * scale; canvas.height = T * scale;
      const ctx = canvas.getContext("2d");
      for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
        const v = Math.sqrt(M[i][j]);  // sqrt: small weights stay visible
        const c = Math.round(255 - 225 * v);
        ctx.fillStyle = `rgb(${c},${Math.round(255 - 170 * v)},255)`;
        ctx.fillRect(j * scale, i * scale, scale, scale);
      }
    }

    function roleOf(l, h) { return D.roles[l][h]; }

    function grid() {
      const g = $("#" + id("grid"));
      g.style.gridTemplateColumns = `repeat(${H}, minmax(60px, 1fr))`;
      g.innerHTML = "";
      for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
        const cell = document.createElement("div");
        cell.className = "mh-cell"; cell.id = id(`cell-${l}-${h}`);
        cell.dataset.layer = l; cell.dataset.head = h;
        const c = document.createElement("canvas");
        paint(c, view(l, h).M, 2);
        const r = roleOf(l, h);
        const lab = document.createElement("div"); lab.className = "mh-lab";
        lab.textContent = `L${l} H${h}`;
        cell.title = r ? `${r.role} head: ${r.text}` : "no clear role";
        cell.append(c, lab);
        if (r) {
          const b = document.createElement("span"); b.className = "mh-badge";
          b.style.background = ROLE_COLORS[r.role] || "#888"; b.textContent = r.role;
          cell.append(b);
        }
        cell.addEventListener("click", () => open(l, h));
        g.append(cell);
      }
    }

    const tip = $("#" + id("tip"));
    function showTip(e, text) {
      tip.textContent = text; tip.style.display = "block";
      tip.style.left = e.clientX + 12 + "px"; tip.style.top = e.clientY + 12 + "px";
    }
    function hideTip() { tip.style.display = "none"; }

    function open(l, h) {
      state.layer = l; state.head = h; state.lock = null;
      root.querySelectorAll(".mh-cell.mh-sel").forEach((c) => c.classList.remove("mh-sel"));
      $("#" + id(`cell-${l}-${h}`)).classList.add("mh-sel");
      const v = view(l, h), T = v.tokens.length, r = roleOf(l, h);
      $("#" + id("title")).textContent = `Layer ${l}, head ${h}: ` +
        (r ? `${r.role} head: ${r.text}` : "no clear role");
      // heatmap with token labels
      const scale = Math.max(6, Math.min(22, Math.floor(420 / Math.max(T, 1))));
      const hm = $("#" + id("heat"));
      paint(hm, v.M, scale);
      hm.onmousemove = (e) => {
        const b = hm.getBoundingClientRect();
        const j = Math.floor((e.clientX - b.left) / b.width * T), i = Math.floor((e.clientY - b.top) / b.height * T);
        if (i >= 0 && j >= 0 && i < T && j < T) showTip(e, `${v.tokens[i]} → ${v.tokens[j]}: ${v.M[i][j].toFixed(4)}`);
      };
      hm.onmouseleave = hideTip;
      lines(v);
    }

    function lines(v) {
      const T = v.tokens.length, svg = $("#" + id("lines")), rowH = 18, width = 360;
      svg.setAttribute("width", width); svg.setAttribute("height", T * rowH + 10);
      const ns = "http://www.w3.org/2000/svg";
      svg.innerHTML = "";
      const edges = [];
      for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
        if (v.M[i][j] < 0.01) continue;
        const p = document.createElementNS(ns, "line");
        p.setAttribute("x1", 110); p.setAttribute("y1", i * rowH + 14);
        p.setAttribute("x2", width - 110); p.setAttribute("y2", j * rowH + 14);
        p.setAttribute("stroke", "#2f6fde"); p.setAttribute("stroke-width", 2);
        p.setAttribute("stroke-opacity", v.M[i][j]);
        p.dataset.from = i; p.dataset.to = j;
        svg.append(p); edges.push(p);
      }
      function filter(i) {
        edges.forEach((e) => { e.style.display = (i === null || +e.dataset.from === i) ? "" : "none"; });
      }
      v.tokens.forEach((t, i) => {
        for (const side of ["left", "right"]) {
          const tx = document.createElementNS(ns, "text");
          tx.setAttribute("x", side === "left" ? 105 : width - 105);
          tx.setAttribute("y", i * rowH + 18);
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
        const r = roleOf(l, h);
        rows.push({head: `L${l} H${h}`, l, h, role: r ? r.role : "", ...Object.fromEntries(names.map((n) => [n, D.metrics[n][l][h]]))});
      }
      let sortKey = "head", desc = false;
      const roleSel = $("#" + id("role"));
      function draw() {
        const want = roleSel.value;
        let shown = rows.filter((r) => !want || r.role === want);
        shown = shown.slice().sort((a, b) => {
          const x = a[sortKey], y = b[sortKey];
          const c = typeof x === "number" ? x - y : (sortKey === "head" ? (a.l - b.l) || (a.h - b.h) : String(x).localeCompare(String(y)));
          return desc ? -c : c;
        });
        const cols = ["head", "role", ...names];
        $("#" + id("table")).innerHTML = "<thead><tr>" + cols.map((c) => `<th data-k="${c}">${c}${c === sortKey ? (desc ? " ▼" : " ▲") : ""}</th>`).join("") +
          "</tr></thead><tbody>" + shown.map((r) => "<tr>" + cols.map((c) => `<td>${typeof r[c] === "number" ? r[c].toFixed(3) : r[c]}</td>`).join("") + "</tr>").join("") + "</tbody>";
        $("#" + id("table")).querySelectorAll("th").forEach((th) => th.addEventListener("click", () => {
          const k = th.dataset.k; desc = sortKey === k ? !desc : typeof rows[0][k] === "number"; sortKey = k; draw();
        }));
      }
      const roles = [...new Set(rows.map((r) => r.role).filter(Boolean))].sort();
      roleSel.innerHTML = `<option value="">all heads</option>` + roles.map((r) => `<option value="${r}">top heads: ${r}</option>`).join("");
      roleSel.addEventListener("change", () => {
        const r = roleSel.value;
        if (r) { const rule = D.role_metric[r]; if (rule) { sortKey = rule; desc = true; } }
        draw();
      });
      draw();
    }

    $("#" + id("special")).addEventListener("change", (e) => { state.hideSpecial = e.target.checked; refresh(); });
    $("#" + id("merge")).addEventListener("change", (e) => { state.merge = e.target.checked; refresh(); });
    function refresh() { grid(); if (state.layer !== null) open(state.layer, state.head); }
    grid(); table();
    if (D.open) open(D.open[0], D.open[1]);
  }

  window.MultiheadReport = {render};
})();

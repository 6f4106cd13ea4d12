"use strict";
// cachalot memory page. Reads the JSON in #data (see view/mod.rs for its
// layout): the events summarized in columns, the largest allocations, the
// segments. Computes each drawn allocation's band once, draws on canvases.
(function () {
  const started = performance.now();
  const D = JSON.parse(document.getElementById("data").textContent);
  const N = Math.max(D.events, 1);
  const PAGE = 2 * 1024 * 1024;
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

  // ---- data, unpacked into typed arrays -------------------------------------
  const nCol = D.columns.length / 6;
  const cLast = new Float64Array(nCol), cTime = new Float64Array(nCol), cAMax = new Float64Array(nCol);
  const cAEnd = new Float64Array(nCol), cRMax = new Float64Array(nCol), cREnd = new Float64Array(nCol);
  for (let c = 0; c < nCol; c++) {
    const o = 6 * c;
    cLast[c] = D.columns[o]; cTime[c] = D.columns[o + 1]; cAMax[c] = D.columns[o + 2];
    cAEnd[c] = D.columns[o + 3]; cRMax[c] = D.columns[o + 4]; cREnd[c] = D.columns[o + 5];
  }
  // One column per event: every figure at every event is exact.
  const perEvent = nCol === D.events;
  const unpackAllocs = (flat) => {
    const n = flat.length / 6, a = { n: n, addr: new Float64Array(n), size: new Float64Array(n), stream: new Float64Array(n),
                                      start: new Int32Array(n), end: new Int32Array(n), stack: new Int32Array(n) };
    for (let k = 0; k < n; k++) {
      const o = 6 * k;
      a.addr[k] = flat[o]; a.size[k] = flat[o + 1]; a.stream[k] = flat[o + 2];
      a.start[k] = flat[o + 3]; a.end[k] = flat[o + 4] < 0 ? N : flat[o + 4]; a.stack[k] = flat[o + 5];
    }
    return a;
  };
  const A = unpackAllocs(D.allocs), nA = A.n;
  const allDrawn = nA === D.allocations;
  const nC = D.chunks.length / 5;
  const chunks = [];
  for (let k = 0; k < nC; k++) {
    const o = 5 * k;
    chunks.push({ addr: D.chunks[o], size: D.chunks[o + 1], start: D.chunks[o + 2],
                  end: D.chunks[o + 3] < 0 ? N : D.chunks[o + 3], mapped: D.chunks[o + 4] === 1 });
  }

  // ---- formatting --------------------------------------------------------
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  function fmtBytes(b) {
    let u = 0;
    while (Math.abs(b) >= 1024 && u < UNITS.length - 1) { b /= 1024; u++; }
    return (u === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : 1)) + " " + UNITS[u];
  }
  const hex = (a) => "0x" + a.toString(16);
  // The column holding event t.
  function colOf(t) {
    let lo = 0, hi = nCol - 1;
    while (lo < hi) { const m = (lo + hi) >> 1; if (cLast[m] < t) lo = m + 1; else hi = m; }
    return lo;
  }
  function fmtUs(us) {
    return us >= 1e6 ? (us / 1e6).toFixed(3) + " s" : (us / 1e3).toFixed(2) + " ms";
  }
  // The recorded time of event t (of its column's last event when columns hold several).
  function fmtTime(t) {
    if (!nCol) return "0 ms";
    const c = colOf(t);
    return (perEvent || cLast[c] === t ? "" : "about ") + fmtUs(cTime[c]);
  }
  function stackLines(stack, max) {
    if (stack < 0) return [];
    return (D.stacks[stack] || []).slice(0, max);
  }
  // First drawn allocation with start > t (allocations are in start order).
  function allocsBefore(t) {
    let lo = 0, hi = nA;
    while (lo < hi) { const m = (lo + hi) >> 1; if (A.start[m] <= t) lo = m + 1; else hi = m; }
    return lo;
  }

  // ---- bands: each drawn allocation's lower edge as steps (t, offset) -------
  // Offsets stack the live drawn allocations in allocation order; freeing one
  // moves every newer live one down by its size.
  const ptsT = new Array(nA), ptsY = new Array(nA);
  (function stack() {
    const ends = [];
    for (let k = 0; k < nA; k++) if (A.end[k] < N) ends.push(k);
    ends.sort((a, b) => A.end[a] - A.end[b] || a - b);
    const order = [], off = new Float64Array(nA);
    let total = 0, next = 0, e = 0;
    while (next < nA || e < ends.length) {
      const t = Math.min(next < nA ? A.start[next] : N, e < ends.length ? A.end[ends[e]] : N);
      for (; e < ends.length && A.end[ends[e]] === t; e++) {
        const k = ends[e];
        let lo = 0, hi = order.length;
        while (lo < hi) { const m = (lo + hi) >> 1; if (order[m] < k) lo = m + 1; else hi = m; }
        if (order[lo] !== k) continue;
        for (let j = lo + 1; j < order.length; j++) {
          const q = order[j];
          off[q] -= A.size[k];
          ptsT[q].push(t); ptsY[q].push(off[q]);
        }
        order.splice(lo, 1);
        total -= A.size[k];
      }
      for (; next < nA && A.start[next] === t; next++) {
        off[next] = total; total += A.size[next];
        ptsT[next] = [t]; ptsY[next] = [off[next]];
        order.push(next);
      }
    }
  })();

  // ---- layout --------------------------------------------------------------
  const dpr = window.devicePixelRatio || 1;
  const W = Math.max(640, Math.min(document.documentElement.clientWidth - 48, 2400));
  const H = 420, M = { l: 78, r: 16, t: 18, b: 34 };
  const PW = W - M.l - M.r, PH = H - M.t - M.b;
  const yMax = Math.max(D.peak_reserved, D.peak_bytes, 1) * 1.06;
  const X = (t) => M.l + (t / N) * PW;
  const Y = (b) => M.t + PH - (b / yMax) * PH;

  function setup(canvas, w, h) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    canvas.style.width = w + "px"; canvas.style.height = h + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  // The outline of band k, thinned to one step per pixel column.
  function bandPath(k) {
    const T = ptsT[k], Yk = ptsY[k];
    if (!T) return null;
    const xs = [], ys = [];
    for (let j = 0; j < T.length; j++) {
      const x = Math.round(X(T[j]));
      if (xs.length && xs[xs.length - 1] === x) ys[ys.length - 1] = Yk[j];
      else { xs.push(x); ys.push(Yk[j]); }
    }
    const xEnd = Math.max(Math.round(X(A.end[k])), xs[0] + 1), h = A.size[k];
    const p = new Path2D();
    p.moveTo(xs[0], Y(ys[0]));
    for (let j = 1; j < xs.length; j++) { p.lineTo(xs[j], Y(ys[j - 1])); p.lineTo(xs[j], Y(ys[j])); }
    p.lineTo(xEnd, Y(ys[ys.length - 1]));
    p.lineTo(xEnd, Y(ys[ys.length - 1] + h));
    for (let j = xs.length - 1; j >= 1; j--) { p.lineTo(xs[j], Y(ys[j] + h)); p.lineTo(xs[j], Y(ys[j - 1] + h)); }
    p.lineTo(xs[0], Y(ys[0] + h));
    p.closePath();
    return p;
  }

  // A column series as a step outline, one step per pixel column (the largest
  // value inside it, so no peak is lost).
  function stepsOf(values) {
    const xs = [], ys = [];
    for (let c = 0; c < nCol; c++) {
      const x0 = Math.round(X(c === 0 ? 0 : cLast[c - 1] + 1));
      if (xs.length && xs[xs.length - 1] === x0) ys[ys.length - 1] = Math.max(ys[ys.length - 1], values[c]);
      else { xs.push(x0); ys.push(values[c]); }
    }
    return { xs: xs, ys: ys };
  }

  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function drawAxes(ctx) {
    ctx.strokeStyle = "#e5e7eb"; ctx.fillStyle = "#4b5563"; ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif"; ctx.textAlign = "right"; ctx.textBaseline = "middle";
    let u = 0; while (yMax / Math.pow(1024, u + 1) >= 1 && u < UNITS.length - 1) u++;
    const unit = Math.pow(1024, u), step = niceStep(yMax / unit / 6) * unit;
    for (let b = 0; b <= yMax; b += step) {
      const y = Math.round(Y(b)) + 0.5;
      ctx.beginPath(); ctx.moveTo(M.l, y); ctx.lineTo(M.l + PW, y); ctx.stroke();
      ctx.fillText((b / unit).toFixed(step / unit < 1 ? 1 : 0) + " " + UNITS[u], M.l - 6, y);
    }
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    const tStep = niceStep(N / 8);
    for (let t = 0; t <= N; t += tStep) {
      const x = Math.round(X(t)) + 0.5;
      ctx.beginPath(); ctx.moveTo(x, M.t + PH); ctx.lineTo(x, M.t + PH + 4); ctx.stroke();
      ctx.fillText(String(t), x, M.t + PH + 6);
    }
    ctx.textAlign = "left";
    const span = nCol ? fmtUs(cTime[nCol - 1]) : "0 ms";
    ctx.fillText("event index (" + span + " from first to last event, recorded time)", M.l, M.t + PH + 20);
  }

  // ---- the timeline ----------------------------------------------------------
  const chart = document.getElementById("chart"), overlay = document.getElementById("overlay");
  const cctx = setup(chart, W, H), octx = setup(overlay, W, H);
  let drawn = 0;
  function drawChart() {
    cctx.fillStyle = "#ffffff"; cctx.fillRect(0, 0, W, H);
    drawAxes(cctx);
    // All active memory, behind the drawn allocations.
    const env = stepsOf(cAMax);
    cctx.fillStyle = "#d1d5db"; cctx.beginPath(); cctx.moveTo(X(0), Y(0));
    for (let j = 0; j < env.xs.length; j++) { cctx.lineTo(env.xs[j], Y(j ? env.ys[j - 1] : 0)); cctx.lineTo(env.xs[j], Y(env.ys[j])); }
    cctx.lineTo(X(N), Y(env.ys.length ? env.ys[env.ys.length - 1] : 0)); cctx.lineTo(X(N), Y(0)); cctx.closePath(); cctx.fill();
    for (let k = 0; k < nA; k++) {
      const p = bandPath(k);
      if (!p) continue;
      cctx.fillStyle = PALETTE[k % PALETTE.length];
      cctx.fill(p);
      drawn++;
    }
    // Reserved memory as a stepped line.
    const res = stepsOf(cRMax);
    cctx.strokeStyle = "#111827"; cctx.lineWidth = 1.5; cctx.beginPath(); cctx.moveTo(X(0), Y(0));
    for (let j = 0; j < res.xs.length; j++) { cctx.lineTo(res.xs[j], Y(j ? res.ys[j - 1] : 0)); cctx.lineTo(res.xs[j], Y(res.ys[j])); }
    cctx.lineTo(X(N), Y(res.ys.length ? res.ys[res.ys.length - 1] : 0)); cctx.stroke();
    // The peak of active memory.
    const px = Math.round(X(D.peak_index)) + 0.5;
    cctx.strokeStyle = "#d62728"; cctx.lineWidth = 1.5; cctx.setLineDash([4, 3]);
    cctx.beginPath(); cctx.moveTo(px, M.t); cctx.lineTo(px, M.t + PH); cctx.stroke(); cctx.setLineDash([]);
    cctx.fillStyle = "#d62728"; cctx.font = "bold 11px system-ui, sans-serif";
    cctx.textAlign = px > W - 200 ? "right" : "left"; cctx.textBaseline = "top";
    cctx.fillText("peak " + fmtBytes(D.peak_bytes) + " at event " + D.peak_index, px + (px > W - 200 ? -4 : 4), M.t + 2);
    // Out-of-memory events.
    for (const i of D.ooms) {
      const x = X(i); cctx.beginPath(); cctx.moveTo(x, M.t); cctx.lineTo(x - 5, M.t - 8); cctx.lineTo(x + 5, M.t - 8); cctx.fill();
    }
  }

  const tip = document.getElementById("tip");
  // The drawn allocation under (t, bytes): walk the live ones in stacking order.
  function allocAt(t, bytes) {
    let off = 0;
    for (let k = 0, n = allocsBefore(t); k < n; k++) {
      if (A.end[k] <= t) continue;
      if (bytes >= off && bytes < off + A.size[k]) return k;
      off += A.size[k];
    }
    return -1;
  }
  let mapCol = 0;
  function drawOverlay(hover) {
    octx.clearRect(0, 0, W, H);
    const mx = Math.round(X(nCol ? cLast[mapCol] : 0)) + 0.5;
    octx.strokeStyle = "#7c3aed"; octx.lineWidth = 1.5;
    octx.beginPath(); octx.moveTo(mx, M.t); octx.lineTo(mx, M.t + PH); octx.stroke();
    if (hover >= 0) {
      const p = bandPath(hover);
      if (p) { octx.fillStyle = "rgba(17,24,39,0.35)"; octx.fill(p); octx.strokeStyle = "#111827"; octx.lineWidth = 1; octx.stroke(p); }
    }
  }
  // What memory held at event t: exact after a column's last event, else the
  // column's largest figures.
  function heldAt(t) {
    const c = colOf(t);
    if (cLast[c] === t) return "active " + fmtBytes(cAEnd[c]) + ", reserved " + fmtBytes(cREnd[c]);
    const first = c === 0 ? 0 : cLast[c - 1] + 1;
    return "events " + first + "-" + cLast[c] + ": active up to " + fmtBytes(cAMax[c]) + ", reserved up to " + fmtBytes(cRMax[c]);
  }
  // Shows the details of the allocation under canvas point (x, y).
  function hoverAt(x, y) {
    const t = Math.floor(((x - M.l) / PW) * N), bytes = ((M.t + PH - y) / PH) * yMax;
    const k = t >= 0 && t < N ? allocAt(t, bytes) : -1;
    drawOverlay(k);
    if (k < 0) { tip.style.display = "none"; return; }
    const freed = A.end[k] < N ? "freed at event " + A.end[k] + " (" + fmtTime(A.end[k]) + ")" : "still live at the end";
    const lines = ["allocation " + hex(A.addr[k]), fmtBytes(A.size[k]) + " (" + A.size[k] + " bytes), stream " + A.stream[k],
                   "allocated at event " + A.start[k] + " (" + fmtTime(A.start[k]) + ")", freed,
                   "at event " + t + ": " + heldAt(t)];
    tip.textContent = lines.concat(stackLines(A.stack[k], 8)).join("\n");
    tip.style.display = "block";
    tip.style.left = Math.min(x + 14, W - 300) + "px"; tip.style.top = (y + 14) + "px";
  }
  let pending = null;
  overlay.addEventListener("mousemove", (ev) => {
    pending = ev;
    requestAnimationFrame(() => {
      if (!pending) return;
      const r = overlay.getBoundingClientRect(), x = pending.clientX - r.left, y = pending.clientY - r.top;
      pending = null;
      hoverAt(x, y);
    });
  });
  overlay.addEventListener("mouseleave", () => { tip.style.display = "none"; drawOverlay(-1); });
  overlay.addEventListener("click", (ev) => {
    const r = overlay.getBoundingClientRect();
    const t = Math.floor(((ev.clientX - r.left - M.l) / PW) * N);
    if (t >= 0 && t < N) setMapCol(colOf(t));
  });

  // ---- segment and page map ----------------------------------------------------
  const map = document.getElementById("map"), mapTip = document.getElementById("map-tip");
  const slider = document.getElementById("slider"), sliderLabel = document.getElementById("slider-label");
  slider.max = String(Math.max(nCol - 1, 0));
  const CELL = 9, GAP = 1, LABEL = 220, ROW = CELL + GAP;
  let cells = [];  // hit boxes: {x, y, seg, page, cap}
  let drawnSegments = 0;

  // Segments live at t: chunks by address, adjacent mapped chunks merged.
  function segmentsAt(t) {
    const live = chunks.filter((c) => c.start <= t && t < c.end).sort((a, b) => a.addr - b.addr);
    const segs = [];
    for (const c of live) {
      const last = segs[segs.length - 1];
      if (last && c.mapped && last.mapped && last.addr + last.size === c.addr) last.size += c.size;
      else segs.push({ addr: c.addr, size: c.size, mapped: c.mapped });
    }
    return segs;
  }

  function drawMap(c) {
    const t = nCol ? cLast[c] : 0;
    const segs = segmentsAt(t);
    const perRow = Math.max(8, Math.floor((W - LABEL) / (CELL + GAP)));
    let rows = 0;
    for (const s of segs) { s.pages = Math.max(1, Math.ceil(s.size / PAGE)); s.used = new Float64Array(s.pages); s.allocs = []; rows += Math.ceil(s.pages / perRow); }
    // Live drawn allocations into their segment's pages.
    const starts = segs.map((s) => s.addr);
    let outside = 0;
    for (let k = 0, n = allocsBefore(t); k < n; k++) {
      if (A.end[k] <= t) continue;
      let lo = 0, hi = starts.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (starts[m] <= A.addr[k]) lo = m + 1; else hi = m; }
      const s = segs[lo - 1];
      if (!s || A.addr[k] >= s.addr + s.size) { outside++; continue; }
      s.allocs.push(k);
      const a0 = A.addr[k] - s.addr, a1 = Math.min(a0 + A.size[k], s.size);
      for (let p = Math.floor(a0 / PAGE); p * PAGE < a1; p++) s.used[p] += Math.min(a1, (p + 1) * PAGE) - Math.max(a0, p * PAGE);
    }
    const h = Math.max(40, rows * ROW + segs.length * 4 + 10);
    const ctx = setup(map, W, h);
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, W, h);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "top";
    cells = [];
    let y = 4;
    for (const s of segs) {
      ctx.fillStyle = "#374151"; ctx.textAlign = "left";
      ctx.fillText(hex(s.addr) + "  " + fmtBytes(s.size) + (s.mapped ? " mapped" : ""), 0, y - 1);
      for (let p = 0; p < s.pages; p++) {
        const cx = LABEL + (p % perRow) * (CELL + GAP), cy = y + Math.floor(p / perRow) * ROW;
        const cap = Math.min(PAGE, s.size - p * PAGE), f = cap > 0 ? s.used[p] / cap : 0;
        ctx.fillStyle = f <= 0 ? "#e5e7eb" : f >= 0.999 ? "#1e3a8a" : "rgb(" + Math.round(191 - 150 * f) + "," + Math.round(219 - 150 * f) + "," + Math.round(254 - 100 * f) + ")";
        ctx.fillRect(cx, cy, CELL, CELL);
        cells.push({ x: cx, y: cy, seg: s, page: p, cap: cap });
      }
      y += Math.ceil(s.pages / perRow) * ROW + 4;
    }
    if (!segs.length) { ctx.fillStyle = "#6b7280"; ctx.fillText("no device memory held after this event", 0, 10); }
    drawnSegments = segs.length;
    document.body.setAttribute("data-drawn-segments", String(drawnSegments));
    sliderLabel.textContent = "event " + t + " of " + D.events + " (" + fmtTime(t) + "): " + segs.length + " segments, " + heldAt(t) +
      (allDrawn ? "" : "; pages shaded by the " + nA + " drawn allocations only") +
      (outside ? ", " + outside + " allocations outside known segments" : "");
  }

  map.addEventListener("mousemove", (ev) => {
    const r = map.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    const c = cells.find((c) => x >= c.x && x < c.x + CELL && y >= c.y && y < c.y + CELL);
    if (!c) { mapTip.style.display = "none"; return; }
    const p0 = c.seg.addr + c.page * PAGE, inPage = c.seg.allocs.filter((k) => A.addr[k] < p0 + c.cap && A.addr[k] + A.size[k] > p0);
    const lines = ["segment " + hex(c.seg.addr) + " (" + fmtBytes(c.seg.size) + "), page " + c.page + " at " + hex(p0),
                   "used " + fmtBytes(c.seg.used[c.page]) + " of " + fmtBytes(c.cap) + " by " + inPage.length + (allDrawn ? "" : " drawn") + " allocations"];
    for (const k of inPage.slice(0, 8)) lines.push("  " + hex(A.addr[k]) + " " + fmtBytes(A.size[k]));
    if (inPage.length > 8) lines.push("  ...");
    mapTip.textContent = lines.join("\n"); mapTip.style.display = "block";
    mapTip.style.left = Math.min(x + 14, W - 300) + "px"; mapTip.style.top = (y + 14) + "px";
  });
  map.addEventListener("mouseleave", () => { mapTip.style.display = "none"; });

  let mapQueued = false;
  function setMapCol(c) {
    mapCol = c; slider.value = String(c); drawOverlay(-1);
    if (mapQueued) return;
    mapQueued = true;
    requestAnimationFrame(() => { mapQueued = false; drawMap(mapCol); });
  }
  slider.addEventListener("input", () => setMapCol(Number(slider.value)));
  document.getElementById("to-peak").addEventListener("click", () => setMapCol(colOf(D.peak_index)));

  // ---- header and the peak table -------------------------------------------------
  function header() {
    document.getElementById("title").textContent = D.title || "cachalot memory";
    document.getElementById("subtitle").textContent = D.subtitle || "";
    const facts = [["events", String(D.events)], ["allocations", String(D.allocations)], ["peak active", fmtBytes(D.peak_bytes)],
                   ["peak reserved", fmtBytes(D.peak_reserved)],
                   ["reserved / active at peaks", D.peak_bytes ? (D.peak_reserved / D.peak_bytes).toFixed(3) : "-"],
                   ["out-of-memory events", String(D.ooms.length)]];
    if (!allDrawn) facts.push(["drawn one by one", nA + " of the largest allocations (the others in gray)"]);
    const box = document.getElementById("facts");
    for (const [k, v] of facts) {
      const span = document.createElement("span"); span.textContent = k + ": ";
      const b = document.createElement("b"); b.textContent = v; span.appendChild(b); box.appendChild(span);
    }
  }
  function peakTable() {
    const P = unpackAllocs(D.peak_rows);
    const body = document.querySelector("#peak-table tbody");
    const row = (k) => [hex(P.addr[k]), fmtBytes(P.size[k]), "event " + P.start[k] + " (" + fmtTime(P.start[k]) + ")",
                        String(P.stream[k]), stackLines(P.stack[k], 1)[0] || ""];
    for (let k = 0; k < P.n; k++) {
      const tr = document.createElement("tr");
      for (const [i, v] of row(k).entries()) { const td = document.createElement("td"); td.textContent = v; if (i === 1) td.className = "num"; tr.appendChild(td); }
      body.appendChild(tr);
    }
    const caption = document.createElement("caption");
    caption.textContent = D.peak_live + " allocations live at event " + D.peak_index + (D.peak_live > P.n ? " (largest " + P.n + " shown)" : "");
    caption.style.textAlign = "left";
    document.getElementById("peak-table").prepend(caption);
  }

  header();
  mapCol = nCol ? colOf(D.peak_index) : 0;
  drawChart();
  drawOverlay(-1);
  peakTable();
  slider.value = String(mapCol);
  drawMap(mapCol);
  // "#t=N" opens the map after event N (the end of its column); "#hover=X,Y"
  // shows the details at that chart point (for screenshots and tests).
  for (const part of location.hash.slice(1).split("&")) {
    const [key, value] = part.split("=");
    if (key === "t" && Number(value) >= 0 && Number(value) < N) { mapCol = colOf(Number(value)); slider.value = String(mapCol); drawMap(mapCol); drawOverlay(-1); }
    if (key === "hover" && value) { const [x, y] = value.split(",").map(Number); hoverAt(x, y); }
  }
  const body = document.body;
  body.setAttribute("data-drawn-allocations", String(drawn));
  body.setAttribute("data-total-allocations", String(D.allocations));
  body.setAttribute("data-peak-active", String(D.peak_bytes));
  body.setAttribute("data-peak-reserved", String(D.peak_reserved));
  body.setAttribute("data-peak-allocations", String(D.peak_live));
  body.setAttribute("data-render-ms", String(Math.round(performance.now() - started)));
})();

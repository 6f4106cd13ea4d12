"use strict";
// cachalot memory page. Reads the JSON in #data (see view/mod.rs for its
// layout), computes each allocation's band once, draws on canvases.
(function () {
  const started = performance.now();
  const D = JSON.parse(document.getElementById("data").textContent);
  const N = Math.max(D.events, 1);
  const PAGE = 2 * 1024 * 1024;
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                   "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

  // ---- data, unpacked into typed arrays -------------------------------------
  const nA = D.allocs.length / 6;
  const aAddr = new Float64Array(nA), aSize = new Float64Array(nA), aStream = new Float64Array(nA);
  const aStart = new Int32Array(nA), aEnd = new Int32Array(nA), aStack = new Int32Array(nA);
  for (let k = 0; k < nA; k++) {
    const o = 6 * k;
    aAddr[k] = D.allocs[o]; aSize[k] = D.allocs[o + 1]; aStream[k] = D.allocs[o + 2];
    aStart[k] = D.allocs[o + 3]; aEnd[k] = D.allocs[o + 4] < 0 ? N : D.allocs[o + 4];
    aStack[k] = D.allocs[o + 5];
  }
  const nC = D.chunks.length / 5;
  const chunks = [];
  for (let k = 0; k < nC; k++) {
    const o = 5 * k;
    chunks.push({ addr: D.chunks[o], size: D.chunks[o + 1], start: D.chunks[o + 2],
                  end: D.chunks[o + 3] < 0 ? N : D.chunks[o + 3], mapped: D.chunks[o + 4] === 1 });
  }
  const rIdx = [], rVal = [];
  for (let k = 0; k < D.reserved.length; k += 2) { rIdx.push(D.reserved[k]); rVal.push(D.reserved[k + 1]); }
  const peakReserved = rVal.reduce((m, v) => Math.max(m, v), 0);

  // ---- formatting --------------------------------------------------------
  const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];
  function fmtBytes(b) {
    let u = 0;
    while (Math.abs(b) >= 1024 && u < UNITS.length - 1) { b /= 1024; u++; }
    return (u === 0 ? b.toFixed(0) : b.toFixed(b < 10 ? 2 : 1)) + " " + UNITS[u];
  }
  const hex = (a) => "0x" + a.toString(16);
  function fmtTime(i) {
    const us = D.times[Math.min(Math.max(i, 0), D.times.length - 1)] || 0;
    return us >= 1e6 ? (us / 1e6).toFixed(3) + " s" : (us / 1e3).toFixed(2) + " ms";
  }
  function stackLines(k, max) {
    if (aStack[k] < 0) return [];
    const s = D.stacks[aStack[k]] || [];
    return s.slice(0, max);
  }
  function reservedAt(t) {
    let lo = 0, hi = rIdx.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (rIdx[m] <= t) lo = m + 1; else hi = m; }
    return lo === 0 ? 0 : rVal[lo - 1];
  }
  // First allocation index with start > t (allocations are in start order).
  function allocsBefore(t) {
    let lo = 0, hi = nA;
    while (lo < hi) { const m = (lo + hi) >> 1; if (aStart[m] <= t) lo = m + 1; else hi = m; }
    return lo;
  }

  // ---- bands: each allocation's lower edge as steps (t, offset) -----------
  // Offsets stack live allocations in allocation order; freeing one moves every
  // newer live allocation down by its size.
  const ptsT = new Array(nA), ptsY = new Array(nA);
  (function stack() {
    const endsAt = new Map();
    for (let k = 0; k < nA; k++) {
      if (aEnd[k] < N) { const l = endsAt.get(aEnd[k]); if (l) l.push(k); else endsAt.set(aEnd[k], [k]); }
    }
    const order = [], off = new Float64Array(nA);
    let total = 0, next = 0;
    for (let t = 0; t < N && (next < nA || order.length); t++) {
      const ends = endsAt.get(t);
      if (ends) {
        for (const k of ends) {
          let lo = 0, hi = order.length;
          while (lo < hi) { const m = (lo + hi) >> 1; if (order[m] < k) lo = m + 1; else hi = m; }
          if (order[lo] !== k) continue;
          for (let j = lo + 1; j < order.length; j++) {
            const q = order[j];
            off[q] -= aSize[k];
            ptsT[q].push(t); ptsY[q].push(off[q]);
          }
          order.splice(lo, 1);
          total -= aSize[k];
        }
      }
      while (next < nA && aStart[next] === t) {
        off[next] = total; total += aSize[next];
        ptsT[next] = [t]; ptsY[next] = [off[next]];
        order.push(next); next++;
      }
    }
  })();

  // ---- layout --------------------------------------------------------------
  const dpr = window.devicePixelRatio || 1;
  const W = Math.max(640, Math.min(document.documentElement.clientWidth - 48, 2400));
  const H = 420, M = { l: 78, r: 16, t: 18, b: 34 };
  const PW = W - M.l - M.r, PH = H - M.t - M.b;
  const yMax = Math.max(peakReserved, D.peak_bytes, 1) * 1.06;
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
    const xEnd = Math.max(Math.round(X(aEnd[k])), xs[0] + 1), h = aSize[k];
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

  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function drawAxes(ctx) {
    ctx.strokeStyle = "#d1d5db"; ctx.fillStyle = "#4b5563"; ctx.lineWidth = 1;
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
    ctx.fillText("event index (" + fmtTime(N - 1) + " from first to last event)", M.l, M.t + PH + 20);
  }

  // ---- the timeline ----------------------------------------------------------
  const chart = document.getElementById("chart"), overlay = document.getElementById("overlay");
  const cctx = setup(chart, W, H), octx = setup(overlay, W, H);
  let drawn = 0;
  function drawChart() {
    cctx.fillStyle = "#ffffff"; cctx.fillRect(0, 0, W, H);
    drawAxes(cctx);
    for (let k = 0; k < nA; k++) {
      const p = bandPath(k);
      if (!p) continue;
      cctx.fillStyle = PALETTE[k % PALETTE.length];
      cctx.fill(p);
      drawn++;
    }
    // Reserved memory as a stepped line.
    cctx.strokeStyle = "#111827"; cctx.lineWidth = 1.5; cctx.beginPath();
    let prev = 0; cctx.moveTo(X(0), Y(0));
    for (let j = 0; j < rIdx.length; j++) { cctx.lineTo(X(rIdx[j]), Y(prev)); cctx.lineTo(X(rIdx[j]), Y(rVal[j])); prev = rVal[j]; }
    cctx.lineTo(X(N), Y(prev)); cctx.stroke();
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
  let mapTime = D.peak_index;
  // The allocation under (t, bytes): walk the live ones in stacking order.
  function allocAt(t, bytes) {
    let off = 0;
    for (let k = 0, n = allocsBefore(t); k < n; k++) {
      if (aEnd[k] <= t) continue;
      if (bytes >= off && bytes < off + aSize[k]) return k;
      off += aSize[k];
    }
    return -1;
  }
  function drawOverlay(hover) {
    octx.clearRect(0, 0, W, H);
    const mx = Math.round(X(mapTime)) + 0.5;
    octx.strokeStyle = "#7c3aed"; octx.lineWidth = 1.5;
    octx.beginPath(); octx.moveTo(mx, M.t); octx.lineTo(mx, M.t + PH); octx.stroke();
    if (hover >= 0) {
      const p = bandPath(hover);
      if (p) { octx.fillStyle = "rgba(17,24,39,0.35)"; octx.fill(p); octx.strokeStyle = "#111827"; octx.lineWidth = 1; octx.stroke(p); }
    }
  }
  // Shows the details of the allocation under canvas point (x, y).
  function hoverAt(x, y) {
    const t = Math.floor(((x - M.l) / PW) * N), bytes = ((M.t + PH - y) / PH) * yMax;
    const k = t >= 0 && t < N ? allocAt(t, bytes) : -1;
    drawOverlay(k);
    if (k < 0) { tip.style.display = "none"; return; }
    const freed = aEnd[k] < N ? "freed at event " + aEnd[k] + " (" + fmtTime(aEnd[k]) + ")" : "still live at the end";
    const lines = ["allocation #" + k + "  " + hex(aAddr[k]), fmtBytes(aSize[k]) + " (" + aSize[k] + " bytes), stream " + aStream[k],
                   "allocated at event " + aStart[k] + " (" + fmtTime(aStart[k]) + ")", freed,
                   "active at event " + t + ": " + fmtBytes(activeAt(t)) + ", reserved " + fmtBytes(reservedAt(t))];
    tip.textContent = lines.concat(stackLines(k, 8)).join("\n");
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
    if (t >= 0 && t < N) setMapTime(t);
  });
  function activeAt(t) {
    let s = 0;
    for (let k = 0, n = allocsBefore(t); k < n; k++) if (aEnd[k] > t) s += aSize[k];
    return s;
  }

  // ---- segment and page map ----------------------------------------------------
  const map = document.getElementById("map"), mapTip = document.getElementById("map-tip");
  const slider = document.getElementById("slider"), sliderLabel = document.getElementById("slider-label");
  slider.max = String(N - 1);
  const CELL = 9, GAP = 1, LABEL = 220, ROW = CELL + GAP;
  let cells = [];  // hit boxes: {x, y, seg, page, used, allocs}
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

  function drawMap(t) {
    const segs = segmentsAt(t);
    const perRow = Math.max(8, Math.floor((W - LABEL) / (CELL + GAP)));
    let rows = 0;
    for (const s of segs) { s.pages = Math.max(1, Math.ceil(s.size / PAGE)); s.used = new Float64Array(s.pages); s.allocs = []; rows += Math.ceil(s.pages / perRow); }
    // Live allocations into their segment's pages.
    const starts = segs.map((s) => s.addr);
    let active = 0, outside = 0;
    for (let k = 0, n = allocsBefore(t); k < n; k++) {
      if (aEnd[k] <= t) continue;
      active += aSize[k];
      let lo = 0, hi = starts.length;
      while (lo < hi) { const m = (lo + hi) >> 1; if (starts[m] <= aAddr[k]) lo = m + 1; else hi = m; }
      const s = segs[lo - 1];
      if (!s || aAddr[k] >= s.addr + s.size) { outside++; continue; }
      s.allocs.push(k);
      const a0 = aAddr[k] - s.addr, a1 = Math.min(a0 + aSize[k], s.size);
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
    if (!segs.length) { ctx.fillStyle = "#6b7280"; ctx.fillText("no device memory held at this time", 0, 10); }
    drawnSegments = segs.length;
    document.body.setAttribute("data-drawn-segments", String(drawnSegments));
    sliderLabel.textContent = "event " + t + " of " + N + " (" + fmtTime(t) + "): " + segs.length + " segments, reserved " +
      fmtBytes(reservedAt(t)) + ", active " + fmtBytes(active) + (outside ? ", " + outside + " allocations outside known segments" : "");
  }

  map.addEventListener("mousemove", (ev) => {
    const r = map.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    const c = cells.find((c) => x >= c.x && x < c.x + CELL && y >= c.y && y < c.y + CELL);
    if (!c) { mapTip.style.display = "none"; return; }
    const p0 = c.seg.addr + c.page * PAGE, inPage = c.seg.allocs.filter((k) => aAddr[k] < p0 + c.cap && aAddr[k] + aSize[k] > p0);
    const lines = ["segment " + hex(c.seg.addr) + " (" + fmtBytes(c.seg.size) + "), page " + c.page + " at " + hex(p0),
                   "used " + fmtBytes(c.seg.used[c.page]) + " of " + fmtBytes(c.cap) + " by " + inPage.length + " allocations"];
    for (const k of inPage.slice(0, 8)) lines.push("  #" + k + " " + hex(aAddr[k]) + " " + fmtBytes(aSize[k]));
    if (inPage.length > 8) lines.push("  ...");
    mapTip.textContent = lines.join("\n"); mapTip.style.display = "block";
    mapTip.style.left = Math.min(x + 14, W - 300) + "px"; mapTip.style.top = (y + 14) + "px";
  });
  map.addEventListener("mouseleave", () => { mapTip.style.display = "none"; });

  let mapQueued = false;
  function setMapTime(t) {
    mapTime = t; slider.value = String(t); drawOverlay(-1);
    if (mapQueued) return;
    mapQueued = true;
    requestAnimationFrame(() => { mapQueued = false; drawMap(mapTime); });
  }
  slider.addEventListener("input", () => setMapTime(Number(slider.value)));
  document.getElementById("to-peak").addEventListener("click", () => setMapTime(D.peak_index));

  // ---- header and the peak table -------------------------------------------------
  function header() {
    document.getElementById("title").textContent = D.title || "cachalot memory";
    document.getElementById("subtitle").textContent = D.subtitle || "";
    const facts = [["events", String(D.events)], ["allocations", String(nA)], ["peak active", fmtBytes(D.peak_bytes)],
                   ["peak reserved", fmtBytes(peakReserved)],
                   ["reserved / active at peaks", D.peak_bytes ? (peakReserved / D.peak_bytes).toFixed(3) : "-"],
                   ["out-of-memory events", String(D.ooms.length)]];
    const box = document.getElementById("facts");
    for (const [k, v] of facts) {
      const span = document.createElement("span"); span.textContent = k + ": ";
      const b = document.createElement("b"); b.textContent = v; span.appendChild(b); box.appendChild(span);
    }
  }
  function peakTable() {
    const live = [];
    for (let k = 0, n = allocsBefore(D.peak_index); k < n; k++) if (aEnd[k] > D.peak_index) live.push(k);
    live.sort((a, b) => aSize[b] - aSize[a]);
    const body = document.querySelector("#peak-table tbody");
    const cells = (k) => [String(k), hex(aAddr[k]), fmtBytes(aSize[k]), "event " + aStart[k] + " (" + fmtTime(aStart[k]) + ")",
                          String(aStream[k]), stackLines(k, 1)[0] || ""];
    for (const k of live.slice(0, 200)) {
      const tr = document.createElement("tr");
      for (const [i, v] of cells(k).entries()) { const td = document.createElement("td"); td.textContent = v; if (i === 2) td.className = "num"; tr.appendChild(td); }
      body.appendChild(tr);
    }
    const caption = document.createElement("caption");
    caption.textContent = live.length + " allocations live at event " + D.peak_index + (live.length > 200 ? " (largest 200 shown)" : "");
    caption.style.textAlign = "left";
    document.getElementById("peak-table").prepend(caption);
    document.body.setAttribute("data-peak-allocations", String(live.length));
  }

  header();
  drawChart();
  drawOverlay(-1);
  peakTable();
  slider.value = String(D.peak_index);
  drawMap(D.peak_index);
  // "#t=N" opens the map at event N; "#hover=X,Y" shows the details at that
  // chart point (for screenshots and tests).
  for (const part of location.hash.slice(1).split("&")) {
    const [key, value] = part.split("=");
    if (key === "t" && Number(value) >= 0 && Number(value) < N) { mapTime = Number(value); slider.value = value; drawMap(mapTime); drawOverlay(-1); }
    if (key === "hover" && value) { const [x, y] = value.split(",").map(Number); hoverAt(x, y); }
  }
  document.body.setAttribute("data-drawn-allocations", String(drawn));
  document.body.setAttribute("data-render-ms", String(Math.round(performance.now() - started)));
})();

/* A small SVG line chart (no library): lines, axes with round ticks, vertical markers, a legend.
   drawChart(svg, {series: [{name, x: [], y: [], color, dash}], markers: [{x, label, color}],
                   xFormat, yFormat}); sets svg.dataset.points to the number of points drawn. */
(function () {
  const NS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#2d6cdf", "#d9822b", "#1f8a4c", "#8e44ad", "#c8372d", "#16a2b8", "#7f8c8d", "#b7950b"];

  function el(name, attrs, parent) {
    const e = document.createElementNS(NS, name);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
    return +v.toPrecision(4) + "";
  }

  function drawChart(svg, opts) {
    const w = svg.clientWidth || 600, h = svg.clientHeight || 220;
    const m = { l: 58, r: 12, t: 18, b: 22 };
    svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
    svg.replaceChildren();
    const series = (opts.series || []).filter((s) => s.x && s.x.length);
    let n = 0, x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of series) {
      n += s.x.length;
      for (let i = 0; i < s.x.length; i++) {
        if (s.x[i] < x0) x0 = s.x[i]; if (s.x[i] > x1) x1 = s.x[i];
        if (s.y[i] < y0) y0 = s.y[i]; if (s.y[i] > y1) y1 = s.y[i];
      }
    }
    svg.dataset.points = String(n);
    if (!n) {
      el("text", { x: w / 2, y: h / 2, "text-anchor": "middle" }, svg).textContent = opts.empty || "no data yet";
      return;
    }
    if (x1 === x0) { x1 = x0 + 1; }
    if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const X = (v) => m.l + ((v - x0) / (x1 - x0)) * (w - m.l - m.r);
    const Y = (v) => h - m.b - ((v - y0) / (y1 - y0)) * (h - m.t - m.b);
    const xf = opts.xFormat || fmt, yf = opts.yFormat || fmt;
    for (const v of ticks(y0, y1, 4)) {
      el("line", { x1: m.l, x2: w - m.r, y1: Y(v), y2: Y(v), class: "gridline" }, svg);
      el("text", { x: m.l - 6, y: Y(v) + 4, "text-anchor": "end" }, svg).textContent = yf(v);
    }
    for (const v of ticks(x0, x1, Math.max(2, Math.floor(w / 110)))) {
      el("text", { x: X(v), y: h - 6, "text-anchor": "middle" }, svg).textContent = xf(v);
    }
    el("line", { x1: m.l, x2: m.l, y1: m.t, y2: h - m.b, class: "axis" }, svg);
    el("line", { x1: m.l, x2: w - m.r, y1: h - m.b, y2: h - m.b, class: "axis" }, svg);
    series.forEach((s, k) => {
      const pts = s.x.map((x, i) => `${X(x).toFixed(1)},${Y(s.y[i]).toFixed(1)}`).join(" ");
      const color = s.color || PALETTE[k % PALETTE.length];
      const line = el("polyline", { points: pts, class: "line", stroke: color }, svg);
      if (s.dash) line.setAttribute("stroke-dasharray", "5 3");
    });
    let labelY = m.t - 4;
    for (const mk of opts.markers || []) {
      if (mk.x < x0 || mk.x > x1) continue;
      const x = X(mk.x);
      el("line", { x1: x, x2: x, y1: m.t, y2: h - m.b, class: "marker", stroke: mk.color || "#c8372d" }, svg);
      const t = el("text", { x: x + 3, y: labelY + 12, class: "marker-label" }, svg);
      t.textContent = mk.label; t.setAttribute("fill", mk.color || "#c8372d");
      labelY = labelY > 40 ? m.t - 4 : labelY + 12;
    }
    const named = series.filter((s) => s.name);
    if (named.length > 1) {
      let lx = w - m.r - 6;
      named.slice(0, 8).reverse().forEach((s) => {
        const t = el("text", { x: lx, y: m.t - 5, "text-anchor": "end" }, svg);
        t.textContent = s.name; t.setAttribute("fill", s.color || PALETTE[series.indexOf(s) % PALETTE.length]);
        lx -= s.name.length * 6.5 + 12;
      });
    }
  }

  window.AerieChart = { drawChart, PALETTE };
})();

/* The job page: while the job runs, re-render its tables (?partial=1) and redraw its curves
   (series.json) every few seconds; one last refresh after it ends, then stop. */
(function () {
  const root = document.getElementById("job");
  if (!root) return;
  const base = root.dataset.job, every = +root.dataset.pollMs || 2000;
  const { drawChart, PALETTE } = window.AerieChart;
  const metricSelect = document.getElementById("metric");
  let last = null, timer = null;

  async function get(url) {
    const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (r.redirected && new URL(r.url).pathname === "/ui/login") { window.location = r.url; throw new Error("signed out"); }
    if (!r.ok) throw new Error(url + ": " + r.status);
    return r;
  }

  const clock = (t) => new Date(t * 1000).toTimeString().slice(0, 8);
  const bytes = (v) => { const a = Math.abs(v); return a >= 1e9 ? (v / 1e9).toFixed(1) + "G" : a >= 1e6 ? (v / 1e6).toFixed(1) + "M" : a >= 1e3 ? (v / 1e3).toFixed(0) + "k" : String(+v.toPrecision(3)); };

  function stepMarkers(data) {
    const out = data.resumes.map((r) => ({ x: r.step, label: `attempt ${r.attempt} resumed @${r.step}`, color: "#2d6cdf" }));
    for (const v of data.verdicts) if (v.step != null) out.push({ x: v.step, label: `${v.kind} (${v.host})`, color: "#c8372d" });
    return out;
  }

  function draw(data) {
    const metric = metricSelect.value, s = data.series;
    document.getElementById("metric-caption").textContent = metricSelect.selectedOptions[0].textContent + " by step (all attempts)";
    document.getElementById("points-note").textContent = `${data.points} steps recorded`;
    const markers = stepMarkers(data);
    drawChart(document.getElementById("chart-loss"), { series: s[metric] ? [{ name: metric, ...s[metric] }] : [], markers });
    drawChart(document.getElementById("chart-throughput"), {
      series: s.tokens_per_s ? [{ name: "tokens/s", ...s.tokens_per_s, color: "#1f8a4c" }] : [], markers, yFormat: bytes });
    const hosts = Object.keys(data.health);
    const vmarks = data.verdicts.map((v) => ({ x: v.t, label: `${v.kind} (${v.host})`, color: "#c8372d" }));
    const per = (field, extra) => hosts.map((h, i) => ({ name: h, color: PALETTE[i % PALETTE.length], ...data.health[h][field], ...(extra || {}) }));
    const opts = { markers: vmarks, xFormat: clock, empty: "no heartbeats sampled yet" };
    drawChart(document.getElementById("chart-util"), { ...opts, series: per("util") });
    drawChart(document.getElementById("chart-mem"), { ...opts, series: per("mem"), yFormat: bytes });
    drawChart(document.getElementById("chart-net"), { ...opts, series: per("rx").concat(per("tx", { dash: true, name: "" })), yFormat: bytes });
    drawChart(document.getElementById("chart-gap"), { ...opts, series: per("gap") });
  }

  async function refreshPanels() {
    const html = await (await get(base + "?partial=1")).text();
    const tpl = document.createElement("template");
    tpl.innerHTML = html;  // rendered and escaped by the server's templates
    for (const part of tpl.content.querySelectorAll("[data-part]")) {
      const target = document.getElementById("part-" + part.dataset.part);
      if (target) target.replaceChildren(...part.childNodes);
    }
    for (const pre of document.querySelectorAll("pre.log")) pre.scrollTop = pre.scrollHeight;
    return document.getElementById("job-state").dataset.running === "true";
  }

  async function refreshSeries() {
    last = await (await get(base + "/series.json")).json();
    draw(last);
  }

  async function tick() {
    let running = true;
    try {
      const results = await Promise.all([refreshPanels(), refreshSeries()]);
      running = results[0];
    } catch (e) { console.warn(e); }
    timer = setTimeout(tick, running ? every : every * 15);  // ended: refresh rarely (ratings may still come)
  }

  metricSelect.addEventListener("change", () => last && draw(last));
  window.addEventListener("resize", () => last && draw(last));
  for (const pre of document.querySelectorAll("pre.log")) pre.scrollTop = pre.scrollHeight;
  tick();
})();

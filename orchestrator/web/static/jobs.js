/* The jobs list: re-render the rows every 5 s (same filters), so states and steps stay current. */
(function () {
  const body = document.getElementById("job-rows");
  if (!body) return;
  async function tick() {
    try {
      const r = await fetch(body.dataset.poll, { credentials: "same-origin", cache: "no-store" });
      if (r.redirected && new URL(r.url).pathname === "/ui/login") { window.location = r.url; return; }
      if (r.ok) body.innerHTML = await r.text();  // rendered and escaped by the server's templates
    } catch (e) { console.warn(e); }
    setTimeout(tick, 5000);
  }
  setTimeout(tick, 5000);
})();

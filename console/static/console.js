// gpufed console: keep the page live without reloading it. Every page is complete HTML from
// the server; this re-fetches it every data-refresh-ms milliseconds with X-Console-Live: 1
// (the server then sends only the part inside #live) and swaps that part in. Paused while the
// tab is hidden, or while the pointer is in a form (so a half-made filter choice survives).
(function () {
  "use strict";
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh-ms") || "0", 10);
  var status = document.getElementById("live-status");
  if (!every || !window.fetch) { return; }
  var busy = false;
  function stamp(text, stale) {
    if (!status) { return; }
    status.textContent = text;
    status.classList.toggle("stale", !!stale);
  }
  function tick() {
    if (busy || document.hidden) { return; }
    var form = document.activeElement && document.activeElement.closest && document.activeElement.closest("form");
    if (form) { return; }
    busy = true;
    fetch(window.location.href, { headers: { "X-Console-Live": "1" }, credentials: "same-origin" })
      .then(function (resp) {
        if (!resp.ok && resp.status !== 404 && resp.status !== 403) { throw new Error("HTTP " + resp.status); }
        return resp.text();
      })
      .then(function (html) {
        var live = document.getElementById("live");
        if (live && live.innerHTML !== html) { live.innerHTML = html; }
        stamp("live · updated " + new Date().toLocaleTimeString(), false);
        body.setAttribute("data-updates", String(1 + parseInt(body.getAttribute("data-updates") || "0", 10)));
      })
      .catch(function (err) { stamp("stale: " + err.message, true); })
      .then(function () { busy = false; });
  }
  setInterval(tick, every);
})();

// spotbook ui: fetch a page's live part again every few seconds and swap it in; when the
// run moved on, reload its notebook. No libraries, nothing from elsewhere.
(function () {
  "use strict";
  var every = Number(document.body.dataset.refresh || "2") * 1000;
  var live = document.getElementById("live");
  if (!live || !live.dataset.src) { return; }
  var frame = document.getElementById("notebook-frame");
  function tick() {
    fetch(live.dataset.src, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        var version = r.headers.get("X-Spotbook-Version");
        return r.text().then(function (html) {
          live.innerHTML = html;
          live.dataset.refreshed = String(Number(live.dataset.refreshed || "0") + 1);
          if (version && version !== live.dataset.version) {
            live.dataset.version = version;
            if (frame) { frame.src = frame.dataset.src + "?v=" + encodeURIComponent(version); }
          }
          document.body.classList.remove("stale");
        });
      })
      .catch(function () { document.body.classList.add("stale"); })
      .then(function () { window.setTimeout(tick, every); });
  }
  window.setTimeout(tick, every);
})();

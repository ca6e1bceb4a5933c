// spotbook ui: fetch a page's live part again every few seconds and swap it in; when the
// run moved on, reload its notebook. No libraries, nothing from elsewhere.
(function () {
  "use strict";
  // the run page's buttons: stop, resume, delete (POST with the dashboard's own header,
  // which a page elsewhere cannot send)
  var said = document.getElementById("said");
  Array.prototype.forEach.call(document.querySelectorAll("button[data-action]"), function (b) {
    b.addEventListener("click", function () {
      if (b.dataset.confirm && !window.confirm(b.dataset.confirm)) { return; }
      b.disabled = true;
      fetch(b.dataset.action, {
        method: "POST", credentials: "same-origin", headers: { "X-Spotbook-Action": "1" }
      })
        .then(function (r) { return r.json().then(function (doc) { return [r.ok, doc]; }); })
        .then(function (res) {
          var doc = res[1];
          if (said) {
            said.textContent = res[0] ? doc.done : doc.error;
            said.className = res[0] ? "done" : "error";
          }
          if (res[0] && doc.next === "/") { window.location.assign("/"); }
        })
        .catch(function (e) { if (said) { said.textContent = String(e); said.className = "error"; } })
        .then(function () { b.disabled = false; });
    });
  });
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

// dbexecutor UI: keeps a page live and asks before destructive actions. No framework, no build step.
//
// Every few seconds (the body's data-refresh), while the tab is visible, the
// page fetches its own URL and swaps the parts marked data-live (by id) for
// the fresh ones: the server renders both, so there is one way to draw a page.
// A part that holds the focus (someone typing in its form) is left alone.
(function () {
  "use strict";
  var every = parseFloat(document.body.getAttribute("data-refresh") || "0") * 1000;
  var status = document.getElementById("live-status");
  var busy = false;

  function say(text, failed) {
    if (!status) return;
    status.textContent = text;
    status.className = failed ? "error" : "";
  }

  function swap(text) {
    var fresh = new DOMParser().parseFromString(text, "text/html");
    var parts = document.querySelectorAll("[data-live][id]");
    for (var i = 0; i < parts.length; i++) {
      var here = parts[i];
      var there = fresh.getElementById(here.id);
      var focus = document.activeElement;
      if (!there || (focus && focus !== document.body && here.contains(focus))) continue;
      if (there.innerHTML !== here.innerHTML) here.innerHTML = there.innerHTML;
      for (var k = 0; k < there.attributes.length; k++) {
        var a = there.attributes[k];
        if (a.name.indexOf("data-") === 0) here.setAttribute(a.name, a.value);
      }
    }
  }

  function tick() {
    if (busy || document.hidden || !document.querySelector("[data-live]")) return;
    busy = true;
    fetch(window.location.href, { headers: { "X-Live": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (text) {
        swap(text);
        say("live · updated " + new Date().toLocaleTimeString(), false);
      })
      .catch(function (e) {
        say("offline (" + e.message + "): retrying", true);
      })
      .then(function () {
        busy = false;
      });
  }

  if (every > 0) window.setInterval(tick, every);

  document.addEventListener("submit", function (e) {
    var form = e.target;
    var ask = form && form.getAttribute && form.getAttribute("data-confirm");
    if (ask && !window.confirm(ask)) e.preventDefault();
  });
})();

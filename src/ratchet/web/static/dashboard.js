// Ratchet dashboard: a little plain JavaScript, all optional (every page works without it).
(function () {
  "use strict";

  // Overview: reload every N seconds while the box is ticked (remembered in localStorage).
  var box = document.getElementById("auto-refresh");
  var period = Number(document.body.getAttribute("data-refresh") || 0);
  if (box && period > 0) {
    var timer = null;
    var arm = function () {
      if (timer) { clearTimeout(timer); timer = null; }
      if (box.checked) { timer = setTimeout(function () { location.reload(); }, period * 1000); }
    };
    box.checked = localStorage.getItem("ratchet.autoRefresh") === "1";
    box.addEventListener("change", function () {
      localStorage.setItem("ratchet.autoRefresh", box.checked ? "1" : "0");
      arm();
    });
    arm();
  }

  // Resolve forms: the result field matters only for "done"; dim it otherwise.
  document.querySelectorAll("form.resolve").forEach(function (form) {
    var result = form.querySelector("label.result");
    var sync = function () {
      var chosen = form.querySelector("input[name=outcome]:checked");
      if (result) { result.classList.toggle("dim", !chosen || chosen.value !== "done"); }
    };
    form.addEventListener("change", sync);
    sync();
  });

  // Every action form: one submit at a time (a double click must not post twice).
  document.querySelectorAll("form[method=post]").forEach(function (form) {
    form.addEventListener("submit", function () {
      form.querySelectorAll("button[type=submit]").forEach(function (b) {
        setTimeout(function () { b.disabled = true; }, 0);
      });
    });
  });
})();

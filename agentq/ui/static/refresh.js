// Keeps every element with data-refresh up to date without reloading the page: its
// content is fetched again from that URL (an HTML fragment the server escaped) every
// few seconds. A fragment being edited (focus inside it) is left until the focus leaves.
(function () {
  "use strict";
  var EVERY_MS = 2000;

  function refresh(element) {
    if (element.contains(document.activeElement) && document.activeElement !== document.body) {
      return;
    }
    fetch(element.dataset.refresh, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        element.innerHTML = html;
        element.dataset.refreshes = String(Number(element.dataset.refreshes || 0) + 1);
        element.classList.remove("stale");
      })
      .catch(function () {
        element.classList.add("stale");
      });
  }

  document.querySelectorAll("[data-refresh]").forEach(function (element) {
    window.setInterval(function () { refresh(element); }, EVERY_MS);
  });
})();

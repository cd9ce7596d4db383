// The console's own script. Pages work without it (they are read as plain HTML); htmx makes them live, and this
// file adds what htmx does not do: confirmation of dangerous actions (data-confirm) and the live clock of "ago" labels.
"use strict";

document.addEventListener("htmx:confirm", (event) => {
  const question = event.detail.elt.getAttribute("data-confirm");
  if (!question) return;
  event.preventDefault();
  if (window.confirm(question)) event.detail.issueRequest(true);
});

// Forms without htmx that ask for confirmation.
document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.getAttribute && form.getAttribute("data-confirm");
  if (question && !form.hasAttribute("hx-post") && !window.confirm(question)) event.preventDefault();
});

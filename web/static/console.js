// The console's own script. Pages work without it (they are read as plain HTML); htmx makes them live, and this
// file adds what htmx does not do: confirmation of dangerous actions (data-confirm), copy buttons, the live clock of
// "ago" labels, and the history's steps that a person opened kept open while a live part reloads.
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

// Copy buttons beside examples: shown only where the script runs (without it, the text is there to select).
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.hidden = false;
    button.addEventListener("click", async () => {
      const source = document.getElementById(button.getAttribute("data-copy"));
      if (!source) return;
      const label = button.textContent;
      try {
        await navigator.clipboard.writeText(source.textContent);
        button.textContent = "Copied";
      } catch {
        button.textContent = "Select the text to copy it";
      }
      setTimeout(() => { button.textContent = label; }, 2000);
    });
  }
});

// A live part (the overview, a model's page) reloads every few seconds: the folded steps of a history row that a
// person opened (details with an id, history_table.html) stay open in the new content instead of closing under them.
let openSteps = [];
document.addEventListener("htmx:beforeSwap", (event) => {
  openSteps = Array.from(event.detail.target.querySelectorAll("details[id][open]"), (details) => details.id);
});
document.addEventListener("htmx:afterSwap", () => {
  for (const id of openSteps) {
    const details = document.getElementById(id);
    if (details) details.open = true;
  }
  openSteps = [];
});

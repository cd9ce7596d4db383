// The token page's copy button: shown only with JavaScript (the field can always be selected and copied by hand).
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  for (const field of document.querySelectorAll("[data-select-all]")) {
    field.addEventListener("focus", () => field.select());
  }
  for (const button of document.querySelectorAll("button[data-copy]")) {
    const field = document.getElementById(button.getAttribute("data-copy"));
    if (!field || !navigator.clipboard) continue;
    button.hidden = false;
    button.addEventListener("click", () => {
      field.select();
      navigator.clipboard.writeText(field.value).then(
        () => { button.textContent = "Copied"; },
        () => { button.textContent = "Copy it by hand"; },
      );
    });
  }
});

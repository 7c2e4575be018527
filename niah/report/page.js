
// The trial filter: every <select data-key=K> keeps the rows whose data-K equals its value
// ("" = any); the text box keeps rows whose text contains it (case-insensitive).
(() => {
  "use strict";
  const rows = Array.from(document.getElementById("trial-rows").rows);
  const selects = Array.from(document.querySelectorAll("#filters select"));
  const text = document.getElementById("f-text");
  const shown = document.getElementById("shown");

  function apply() {
    const want = selects.filter((s) => s.value !== "").map((s) => [s.dataset.key, s.value]);
    const needle = text.value.trim().toLowerCase();
    let n = 0;
    for (const tr of rows) {
      let keep = want.every(([key, value]) => tr.dataset[key] === value);
      if (keep && needle) keep = tr.textContent.toLowerCase().includes(needle);
      tr.hidden = !keep;
      if (keep) n += 1;
    }
    shown.textContent = `${n} of ${rows.length} trials shown`;
  }

  selects.forEach((s) => s.addEventListener("change", apply));
  text.addEventListener("input", apply);
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  apply();
})();

// The live charts of the metrics page (uPlot). The page is served with a table of the latest values for browsers
// without JavaScript; this script shows the charts instead, polls /metrics/data for the points after the last one
// it has, appends them, and redraws. Colours come from the page's CSS (light and dark), sizes from the layout.
// Times are UTC and 24-hour, as in the console's tables. The range picker's choice (the page's `range`, a plain
// form field) is applied at once here; the latency chart can switch to a log scale.
// window.edgedCharts holds each chart (its uPlot and its series' labels), for whoever inspects the page.
"use strict";

(() => {
  const root = document.getElementById("charts");
  if (!root || typeof window.uPlot !== "function") return;
  const uPlot = window.uPlot;
  const source = root.dataset.source;
  const model = root.dataset.model || "";
  const pollMs = Number(root.dataset.pollMs) || 1500;
  const buckets = JSON.parse(root.dataset.buckets || "[]");
  const percentiles = JSON.parse(root.dataset.percentiles || "[]");
  const status = document.getElementById("charts-status");
  // Seconds shown, the newest point last; null: every point the daemon keeps.
  let rangeS = Number(root.dataset.rangeS) || null;
  const logToggle = document.getElementById("latency-log");

  // --- the points ------------------------------------------------------------------------------------------
  // Every series flattened under a key ("m:<model>:request_rate", "d:cpu" ...), aligned with `time`.
  const store = { time: [], series: new Map(), totals: new Map(), capacity: 600 };
  let since = null;

  function flatten(reply) {
    const flat = new Map();
    for (const [name, m] of Object.entries(reply.models || {})) {
      for (const key of ["request_rate", "rejected_rate", "failed_rate", "queue_ms", "compute_ms", "batch_size_mean"]) {
        flat.set(`m:${name}:${key}`, m[key]);
      }
      for (const [label, values] of Object.entries(m.latency_ms || {})) flat.set(`m:${name}:${label}`, values);
      (m.batch_executions || []).forEach((values, index) => flat.set(`m:${name}:b${index}`, values));
    }
    // Errors answered for no served model: the device's only, drawn with the errors of all models.
    flat.set("u:errors", reply.unknown_model_error_rate || []);
    const device = reply.device || {};
    flat.set("d:cpu", (device.cpu_utilization || []).map((v) => (v == null ? null : v * 100)));
    flat.set("d:memory", device.memory_used_bytes || []);
    store.totals.set("d:memory", device.memory_total_bytes);
    for (const [uuid, gpu] of Object.entries(device.gpus || {})) {
      flat.set(`g:${uuid}:utilization`, (gpu.utilization || []).map((v) => (v == null ? null : v * 100)));
      flat.set(`g:${uuid}:memory`, gpu.memory_used_bytes || []);
      store.totals.set(`g:${uuid}:memory`, gpu.memory_total_bytes);
    }
    return flat;
  }

  function append(reply) {
    const times = reply.time || [];
    store.capacity = reply.capacity || store.capacity;
    const last = store.time.length ? store.time[store.time.length - 1] : null;
    if (last !== null && times.length && times[0] <= last) {
      // The history was sent whole again (the daemon's clock went back): start over from it.
      store.time = [];
      store.series.clear();
    }
    const before = store.time.length;
    const flat = flatten(reply);
    const none = (n) => new Array(n).fill(null);
    for (const [key, values] of store.series) {
      store.series.set(key, values.concat(flat.has(key) ? flat.get(key) : none(times.length)));
    }
    for (const [key, values] of flat) {
      if (!store.series.has(key)) store.series.set(key, none(before).concat(values));
    }
    store.time = store.time.concat(times);
    const extra = store.time.length - store.capacity;
    if (extra > 0) {
      store.time = store.time.slice(extra);
      for (const [key, values] of store.series) store.series.set(key, values.slice(extra));
    }
    // A series with no value left in the window (a model gone for ten minutes) is dropped.
    for (const [key, values] of store.series) {
      if (values.every((v) => v == null)) store.series.delete(key);
    }
  }

  function models() {
    const names = new Set();
    for (const key of store.series.keys()) if (key.startsWith("m:")) names.add(key.slice(2, key.lastIndexOf(":")));
    return [...names].sort();
  }

  function gpus() {
    const ids = new Set();
    for (const key of store.series.keys()) if (key.startsWith("g:")) ids.add(key.slice(2, key.lastIndexOf(":")));
    return [...ids].sort();
  }

  const values = (key) => store.series.get(key) || new Array(store.time.length).fill(null);

  function sum(keys) {
    return store.time.map((_, i) => {
      let total = null;
      for (const key of keys) {
        const v = values(key)[i];
        if (v != null) total = (total || 0) + v;
      }
      return total;
    });
  }

  // --- what each chart shows ---------------------------------------------------------------------------------
  const one = (name, label) => (model || models().length === 1 ? label : `${name} ${label}`);
  const perModel = (key, label) =>
    models().map((name) => ({ label: model || models().length === 1 ? label : name, values: values(`m:${name}:${key}`) }));

  const number = (digits) => (v) => (v == null ? "–" : v.toFixed(v !== 0 && Math.abs(v) < 10 ? digits : 0));
  const perSecond = (v) => (v == null ? "–" : `${number(1)(v)}/s`);
  const ms = (v) => (v == null ? "–" : v < 10 ? `${v.toFixed(2)} ms` : v < 1000 ? `${v.toFixed(1)} ms` : `${(v / 1000).toFixed(2)} s`);
  const percent = (v) => (v == null ? "–" : `${v.toFixed(0)} %`);
  function bytes(v) {
    if (v == null) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let amount = v;
    let unit = 0;
    while (amount >= 1024 && unit < units.length - 1) {
      amount /= 1024;
      unit += 1;
    }
    return unit === 0 ? `${amount.toFixed(0)} B` : `${amount.toFixed(1)} ${units[unit]}`;
  }

  const CHARTS = {
    requests: { format: perSecond, min: 0, series: () => perModel("request_rate", "requests") },
    latency: {
      format: ms,
      min: 0,
      log: () => !!(logToggle && logToggle.checked),
      series: () =>
        models().flatMap((name) =>
          percentiles.map((p) => ({ label: one(name, p), values: values(`m:${name}:${p}`) })),
        ),
    },
    timing: {
      format: ms,
      min: 0,
      series: () =>
        models().flatMap((name) => [
          { label: one(name, "queue"), values: values(`m:${name}:queue_ms`) },
          { label: one(name, "compute"), values: values(`m:${name}:compute_ms`) },
        ]),
    },
    batch: { format: number(1), min: 0, series: () => perModel("batch_size_mean", "mean batch size") },
    executions: {
      format: perSecond,
      min: 0,
      // Summed over the models shown; only the batch sizes that ran in the window.
      series: () =>
        buckets
          .map((label, index) => ({
            label: `batch ${label}`,
            values: sum(models().map((name) => `m:${name}:b${index}`)),
          }))
          .filter((s) => s.values.some((v) => v != null && v > 0)),
    },
    errors: {
      format: perSecond,
      min: 0,
      // Rejected before the model ran (the client's request was wrong) apart from failed while it ran.
      series: () => {
        const unknown = { label: "no such model", values: values("u:errors") };
        const shown = !model && unknown.values.some((v) => v != null && v > 0);
        return models()
          .flatMap((name) => [
            { label: one(name, "rejected"), values: values(`m:${name}:rejected_rate`) },
            { label: one(name, "failed"), values: values(`m:${name}:failed_rate`) },
          ])
          .concat(shown ? [unknown] : []);
      },
    },
    utilization: {
      format: percent,
      min: 0,
      max: 100,
      series: () => [
        { label: "CPU", values: values("d:cpu") },
        ...gpus().map((id) => ({ label: `GPU ${id}`, values: values(`g:${id}:utilization`) })),
      ],
    },
    memory: {
      format: bytes,
      min: 0,
      series: () => [
        { label: "memory", values: values("d:memory"), total: store.totals.get("d:memory") },
        ...gpus().map((id) => ({ label: `GPU ${id}`, values: values(`g:${id}:memory`), total: store.totals.get(`g:${id}:memory`) })),
      ],
    },
  };

  // --- drawing -----------------------------------------------------------------------------------------------
  const charts = {};
  window.edgedCharts = charts;

  function colours() {
    const style = getComputedStyle(root);
    const read = (name) => style.getPropertyValue(name).trim();
    const palette = [];
    for (let i = 1; i <= 8; i += 1) palette.push(read(`--chart-${i}`) || "#0b5cad");
    return { palette, axis: read("--chart-axis") || "#58606b", grid: read("--chart-grid") || "#d6dae0" };
  }

  // Series past the eighth reuse the colours, so they are told apart by a dash pattern instead.
  const DASHES = [[], [6, 3], [2, 3], [8, 3, 2, 3]];

  const heightFor = (width) => (width < 480 ? 180 : 220);

  // --- time, in UTC --------------------------------------------------------------------------------------------
  const pad = (n) => String(n).padStart(2, "0");
  const utcTime = (t) => {
    const d = new Date(t * 1000);
    return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`;
  };
  const utcDateTime = (t) => {
    const d = new Date(t * 1000);
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ${utcTime(t)}`;
  };
  // Tick steps in seconds; uPlot takes the smallest that leaves `space` pixels between ticks.
  const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];

  // The axes' text is drawn on the canvas, where nothing lays it out: the room a label takes is measured with the
  // font it is drawn in, and ticks are kept at least that far apart (so that no two labels overlap at any width).
  const AXIS_FONT_PX = 12;
  const axisFont = () => `${AXIS_FONT_PX}px ${getComputedStyle(root).fontFamily || "sans-serif"}`;
  function timeLabelWidth(font) {
    const context = document.createElement("canvas").getContext("2d");
    context.font = font;
    // The widest digit in every place: in a proportional font "00:00:00" is not the widest time.
    const digit = Math.max(...[..."0123456789"].map((c) => context.measureText(c).width));
    return Math.ceil(6 * digit + 2 * context.measureText(":").width);
  }
  const LABEL_GAP = 16;

  function yRange(def) {
    return (u, min, max) => {
      const top = def.max !== undefined ? def.max : max == null || max <= 0 ? 1 : max * 1.1;
      return [def.min, top];
    };
  }

  function logRange(u, min, max) {
    // Whole decades around what is shown: p50 and p99 keep their own place when one is a hundred times the other.
    if (min == null || max == null || !(min > 0)) return [0.1, 10];
    const lo = 10 ** Math.floor(Math.log10(min));
    const hi = 10 ** Math.ceil(Math.log10(max));
    return [lo, hi > lo ? hi : lo * 10];
  }

  function xRange(u, min, max) {
    if (min == null || max == null) {
      const now = Date.now() / 1000;
      return [now - (rangeS || 60), now];
    }
    // The whole range picked, even while the daemon has fewer points; one point alone still spans some time.
    return [rangeS ? max - rangeS : Math.min(min, max - 10), max];
  }

  function options(def, labels, width) {
    const { palette, axis, grid } = colours();
    const font = axisFont();
    const timeWidth = timeLabelWidth(font);
    const log = def.log && def.log();
    const line = { stroke: grid, width: 1 };
    // The legend shows each series' current value while the pointer is not on the chart (see showLatest).
    const current = (u, v, seriesIndex, index) =>
      index != null && index === u.data[0].length - 1 && v == null ? latest(u.data[seriesIndex]) : v;
    return {
      width,
      height: heightFor(width),
      // Room on the right for half the newest time label, which is centred on the plot's right edge.
      padding: [8, Math.ceil(timeWidth / 2) + 4, 0, 0],
      tzDate: (t) => uPlot.tzDate(new Date(t * 1000), "Etc/UTC"),
      series: [
        { label: "Time (UTC)", value: (u, v) => (v == null ? "–" : utcDateTime(v)) },
        ...labels.map((label, i) => ({
          label,
          stroke: palette[i % palette.length],
          dash: DASHES[Math.floor(i / palette.length) % DASHES.length],
          width: 2,
          points: { show: false },
          value: (u, v, seriesIndex, index) => def.format(current(u, v, seriesIndex, index)),
        })),
      ],
      scales: {
        x: { time: true, range: xRange },
        y: log ? { distr: 3, log: 10, range: logRange } : { range: yRange(def) },
      },
      axes: [
        {
          stroke: axis,
          grid: line,
          ticks: line,
          font,
          labelFont: font,
          label: "Time (UTC)",
          labelSize: 20,
          incrs: TIME_INCRS,
          space: timeWidth + LABEL_GAP,
          values: (u, ticks) => ticks.map((t) => (t == null ? null : utcTime(t))),
        },
        {
          stroke: axis,
          grid: line,
          ticks: line,
          font,
          size: 86,
          // Labels are one line of AXIS_FONT_PX high: ticks at least twice that apart leave a line between them.
          space: 2 * AXIS_FONT_PX + 4,
          values: (u, ticks) => ticks.map((v) => (v == null ? null : def.format(v))),
        },
      ],
      cursor: { drag: { x: false, y: false } },
      legend: { show: true },
      hooks: { setCursor: [showLatest] },
    };
  }

  function showLatest(u) {
    // uPlot's legend shows the values under the pointer, and dashes once it leaves: without the pointer, the
    // newest point's (each series' latest value, see `current`).
    if (u.cursor.idx == null && u.data[0].length) u.setLegend({ idx: u.data[0].length - 1 });
  }

  function latest(series) {
    // The newest value of the last few points: a second without requests has none.
    for (let i = series.length - 1; i >= Math.max(0, series.length - 5); i -= 1) if (series[i] != null) return series[i];
    return null;
  }

  function summarize(id, def, series) {
    const element = document.getElementById(`chart-${id}-summary`);
    if (!element) return;
    if (!store.time.length || !series.length) {
      element.textContent = id === "executions" ? "No executions in the last minutes." : "No points yet.";
      return;
    }
    const parts = series.map((s) => {
      const value = latest(s.values);
      const total = s.total ? ` of ${def.format(s.total)}` : "";
      return `${s.label} ${def.format(value)}${value == null ? "" : total}`;
    });
    element.textContent = `Latest: ${parts.join(", ")}.`;
  }

  function draw(id) {
    const figure = document.getElementById(`chart-${id}`);
    const def = CHARTS[id];
    if (!figure || !def) return;
    const series = def.series();
    const labels = series.map((s) => s.label);
    const log = !!(def.log && def.log());
    const data = shown([store.time, ...series.map((s) => s.values)], log);
    const chart = charts[id];
    if (chart && chart.log === log && chart.labels.join("\n") === labels.join("\n")) {
      chart.plot.setData(data);
      showLatest(chart.plot);
    } else {
      // New series (a model appeared, a batch size ran): uPlot's series are fixed, so the chart is made anew.
      if (chart) chart.plot.destroy();
      const holder = figure.querySelector(".plot");
      const width = Math.max(200, holder.clientWidth);
      charts[id] = { plot: new uPlot(options(def, labels, width), data, holder), labels, log };
      showLatest(charts[id].plot);
    }
    summarize(id, def, series);
  }

  function shown(data, log) {
    // The points in the range picked; on a log scale a zero has no place, so it is a gap.
    let first = 0;
    if (rangeS && store.time.length) {
      const from = store.time[store.time.length - 1] - rangeS;
      while (first < store.time.length && store.time[first] < from) first += 1;
    }
    return data.map((values, index) =>
      values.slice(first).map((v) => (log && index > 0 && v != null && v <= 0 ? null : v)),
    );
  }

  function drawAll() {
    for (const id of Object.keys(CHARTS)) draw(id);
  }

  function rebuild() {
    for (const id of Object.keys(charts)) {
      charts[id].plot.destroy();
      delete charts[id];
    }
    drawAll();
  }

  // --- polling -----------------------------------------------------------------------------------------------
  let failures = 0;

  function say(text) {
    if (status.textContent !== text) status.textContent = text;
  }

  async function poll() {
    if (!document.hidden) {
      const query = new URLSearchParams({ model });
      if (since !== null) query.set("since", String(since));
      try {
        const response = await fetch(`${source}?${query}`, {
          headers: { Accept: "application/json" },
          credentials: "same-origin",
          cache: "no-store",
        });
        if (response.redirected || response.status === 401) {
          window.location.reload(); // the session ended: the page itself goes to the login
          return;
        }
        if (!response.ok) throw new Error(`the server answered ${response.status}`);
        const reply = await response.json();
        append(reply);
        if (reply.last != null) since = reply.last;
        drawAll();
        failures = 0;
        say(`Live: updated every ${(pollMs / 1000).toFixed(1)} seconds.`);
      } catch (error) {
        failures += 1;
        say(`Live updates are interrupted (${error.message}); trying again.`);
      }
    }
    window.setTimeout(poll, failures ? Math.min(30000, pollMs * 2 ** failures) : pollMs);
  }

  root.hidden = false;
  const resize = new ResizeObserver(() => {
    for (const [id, chart] of Object.entries(charts)) {
      const holder = document.querySelector(`#chart-${id} .plot`);
      const width = Math.max(200, holder.clientWidth);
      if (width !== chart.plot.width) chart.plot.setSize({ width, height: heightFor(width) });
    }
  });
  for (const holder of root.querySelectorAll(".plot")) resize.observe(holder);
  if (logToggle) logToggle.addEventListener("change", () => draw("latency"));
  const rangeSelect = document.getElementById("range");
  if (rangeSelect) {
    // Applied without a reload (the form still sends it, for the table without JavaScript); the address keeps
    // the choice, so a reload or a shared link shows the same range.
    rangeSelect.addEventListener("change", () => {
      const choice = rangeSelect.value;
      rangeS = Number(rangeSelect.selectedOptions[0].dataset.seconds) || null;
      const url = new URL(window.location.href);
      url.searchParams.set("range", choice);
      window.history.replaceState(null, "", url);
      drawAll();
    });
  }
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", rebuild);
  // The console's own light/dark choice is <html data-theme>: the lines take its palette when it changes.
  new MutationObserver(rebuild).observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
  poll();
})();

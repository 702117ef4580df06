
const made = [];
global.Chart = function (canvas, cfg) { made.push([canvas.id, cfg]); };
Chart.defaults = {font: {}};
global.document = {getElementById: (id) => id === 'fusekit-data' ? {textContent: "{\"cases\":[{\"name\":\"layernorm/8192x768/fp16/fwd\",\"variant\":\"baseline\",\"median_us\":25,\"speedup\":1},{\"name\":\"layernorm/8192x768/fp16/fwd\",\"variant\":\"fused\",\"median_us\":10,\"speedup\":2.5},{\"name\":\"attn, \\\"windowed\\\" 7x7 | mask\",\"variant\":\"baseline\",\"median_us\":1200,\"speedup\":1},{\"name\":\"attn, \\\"windowed\\\" 7x7 | mask\",\"variant\":\"peer:compile\",\"median_us\":900,\"speedup\":null}],\"kernels\":[{\"name\":\"void f<int, 2>(float*)\",\"short_name\":\"f\",\"percent\":4.166666666666667},{\"name\":\"evil<\\/script><script>alert('x')<\\/script>&\\\"<\\u0021--<script>\",\"short_name\":\"evilalert\",\"percent\":4.166666666666667},{\"name\":\"with, comma \\\"and quote\\\"\",\"short_name\":\"quote\\\"\",\"percent\":4.166666666666667},{\"name\":\"a|b\",\"short_name\":\"a|b\",\"percent\":4.166666666666667},{\"name\":\"kernel_4\",\"short_name\":\"kernel_4\",\"percent\":4.166666666666667},{\"name\":\"kernel_5\",\"short_name\":\"kernel_5\",\"percent\":4.166666666666667},{\"name\":\"kernel_6\",\"short_name\":\"kernel_6\",\"percent\":4.166666666666667},{\"name\":\"kernel_7\",\"short_name\":\"kernel_7\",\"percent\":4.166666666666667},{\"name\":\"kernel_8\",\"short_name\":\"kernel_8\",\"percent\":4.166666666666667},{\"name\":\"kernel_9\",\"short_name\":\"kernel_9\",\"percent\":4.166666666666667},{\"name\":\"kernel_10\",\"short_name\":\"kernel_10\",\"percent\":4.166666666666667},{\"name\":\"kernel_11\",\"short_name\":\"kernel_11\",\"percent\":4.166666666666667},{\"name\":\"kernel_12\",\"short_name\":\"kernel_12\",\"percent\":4.166666666666667},{\"name\":\"kernel_13\",\"short_name\":\"kernel_13\",\"percent\":4.166666666666667},{\"name\":\"kernel_14\",\"short_name\":\"kernel_14\",\"percent\":4.166666666666667},{\"name\":\"kernel_15\",\"short_name\":\"kernel_15\",\"percent\":4.166666666666667},{\"name\":\"kernel_16\",\"short_name\":\"kernel_16\",\"percent\":4.166666666666667},{\"name\":\"kernel_17\",\"short_name\":\"kernel_17\",\"percent\":4.166666666666667},{\"name\":\"kernel_18\",\"short_name\":\"kernel_18\",\"percent\":4.166666666666667},{\"name\":\"kernel_19\",\"short_name\":\"kernel_19\",\"percent\":4.166666666666667}],\"other_kernels\":{\"count\":4,\"percent\":16.666666666666668}}"} : (["chart-medians", "chart-speedups", "chart-kernels"].includes(id) ? {id} : null)};

(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('fusekit-data').textContent);
  const palette = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
                   '#9c755f', '#bab0ac'];
  Chart.defaults.animation = false;
  Chart.defaults.font.family = 'system-ui, sans-serif';
  const unique = (values) => values.filter((v, i) => values.indexOf(v) === i);

  // One group of bars per case name, one dataset per variant; value(c) is null where a case has no value.
  function grouped(cases, value) {
    const names = unique(cases.map((c) => c.name));
    const variants = unique(cases.map((c) => c.variant));
    const datasets = variants.map((variant, i) => ({
      label: variant,
      backgroundColor: palette[i % palette.length],
      skipNull: true,
      data: names.map((name) => {
        const c = cases.find((c) => c.name === name && c.variant === variant);
        return c === undefined ? null : value(c);
      }),
    }));
    return {labels: names, datasets: datasets};
  }

  function bars(id, chartData, options) {
    const canvas = document.getElementById(id);
    if (canvas === null) return;
    new Chart(canvas, {type: 'bar', data: chartData, options: Object.assign({
      responsive: true, maintainAspectRatio: false,
    }, options)});
  }

  const axis = (title, extra) => Object.assign({title: {display: true, text: title}}, extra || {});
  const medians = data.cases.map((c) => c.median_us).filter((v) => v > 0);
  const logScale = medians.length > 0 && Math.max(...medians) / Math.min(...medians) > 100;
  bars('chart-medians', grouped(data.cases, (c) => c.median_us), {
    scales: {y: axis('median (us)' + (logScale ? ', log scale' : ''), logScale ? {type: 'logarithmic'} : {})},
    plugins: {tooltip: {callbacks: {label: (item) => item.dataset.label + ': ' + item.parsed.y.toFixed(3) + ' us'}}},
  });

  const compared = data.cases.filter((c) => c.variant !== 'baseline' && c.speedup !== null);
  bars('chart-speedups', grouped(compared, (c) => c.speedup), {
    scales: {y: axis('speedup over baseline (x)', {beginAtZero: true})},
    plugins: {tooltip: {callbacks: {label: (item) => item.dataset.label + ': ' + item.parsed.y.toFixed(2) + 'x'}}},
  });

  const kernels = data.kernels.slice();
  if (data.other_kernels.count > 0) {
    kernels.push({name: data.other_kernels.count + ' other kernels', short_name: 'other',
                  percent: data.other_kernels.percent});
  }
  bars('chart-kernels', {
    labels: kernels.map((k) => k.short_name),
    datasets: [{label: 'share of kernel time (%)', data: kernels.map((k) => k.percent),
                backgroundColor: palette[0]}],
  }, {
    indexAxis: 'y',
    scales: {x: axis('share of kernel time (%)', {beginAtZero: true})},
    plugins: {legend: {display: false}, tooltip: {callbacks: {
      title: (items) => kernels[items[0].dataIndex].name,
      label: (item) => item.parsed.x.toFixed(1) + ' % of kernel time',
    }}},
  });
})();

for (const [id, cfg] of made) {
  console.log(id, JSON.stringify(cfg.data.labels), JSON.stringify(cfg.data.datasets.map(d => [d.label, d.data])), JSON.stringify(cfg.options.scales));
  const cb = cfg.options.plugins.tooltip.callbacks;
  const item = {dataset: cfg.data.datasets[0], parsed: {x: 1.234, y: 2.5}, dataIndex: 0};
  console.log('  tooltip:', cb.title ? cb.title([item]) : '', '|', cb.label(item));
}

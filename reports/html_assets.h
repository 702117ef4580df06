// The HTML report's stylesheet and script, inlined into every page (reports/html.cpp).
//
// The script reads the page's JSON data element (id "fusekit-data", written by html.cpp) and:
//   - sorts a table.sortable by the column whose header is clicked (numbers by the cells' data-v, empty
//     cells last; a second click reverses);
//   - draws each operator's chart of fused's speedup over the other variants, by case ("speedup-<i>");
//   - draws each operator's history: a line per case of one variant's median over the runs ("history-<i>",
//     the variant chosen with "history-variant-<i>"; relative to the median in this report's run or in us,
//     as "history-scale-<i>" says);
//   - fills a case's kernel block (<details data-case="<j>">) when it is first opened: one stacked bar per
//     variant of its kernel time shares, then a table of the shares, kernel by kernel, with the variants side
//     by side; the full kernel name in each tooltip;
//   - draws the whole run's kernel time shares ("chart-kernels"), which only runs without cases show.
#pragma once

#include <string_view>

namespace fusekit::reports {

inline constexpr std::string_view kHtmlStyle = R"CSS(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2125; margin: 2rem auto;
       max-width: 1280px; padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2.2rem; border-bottom: 1px solid #d8dde3; }
h3 { font-size: 1.05rem; margin-top: 1.4rem; }
table { border-collapse: collapse; margin: 0.5rem 0; }
th, td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #e4e8ec; vertical-align: top; text-align: left; }
th { background: #f3f5f7; }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.name { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12px;
        word-break: break-all; }
td.name { min-width: 40ch; }
td small, th small { display: block; color: #5b6570; font-size: 11px; font-weight: normal; }
table.meta th { text-align: left; white-space: nowrap; }
table.sortable th { cursor: pointer; user-select: none; }
table.sortable th[aria-sort="ascending"]::after { content: " \25B2"; font-size: 10px; }
table.sortable th[aria-sort="descending"]::after { content: " \25BC"; font-size: 10px; }
.faster { color: #1a7f37; } .slower { color: #c62828; }
.chart { position: relative; width: 100%; }
.small-chart { position: relative; width: 100%; max-width: 900px; }
.note, .empty { color: #5b6570; }
.warning { background: #fff4e5; border-left: 4px solid #f0a020; padding: 0.5rem 0.8rem; }
details { margin: 0.25rem 0; }
details > summary { cursor: pointer; }
details.case { border-left: 3px solid #d8dde3; padding-left: 0.6rem; }
details.case[open] { border-left-color: #4e79a7; padding-bottom: 0.6rem; }
.kernels { margin-top: 0.4rem; }
.kbar-row { display: flex; align-items: center; gap: 0.6rem; margin: 0.2rem 0; }
.kbar-label { width: 15rem; flex: none; }
.kbar-label small { display: block; color: #5b6570; font-size: 11px; }
.kbar { flex: 1; display: flex; height: 1.6rem; border-radius: 3px; overflow: hidden; background: #eef1f4; }
.kbar span { display: block; flex: none; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; color: #fff;
             font-size: 11px; line-height: 1.6rem; padding: 0 3px; box-sizing: border-box; min-width: 0; }
.kbar span.other { color: #1d2125; }
.swatch { display: inline-block; width: 0.8em; height: 0.8em; border-radius: 2px; margin-right: 0.4em;
          vertical-align: -0.05em; }
.history-controls { margin: 0.4rem 0; } .history-controls label { margin-right: 1.2rem; }
.scroll { overflow-x: auto; }
)CSS";

inline constexpr std::string_view kHtmlScript = R"JS(
(function () {
  'use strict';
  const data = JSON.parse(document.getElementById('fusekit-data').textContent);
  const palette = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7',
                   '#9c755f', '#2f4b7c', '#a05195', '#008b8b', '#d45087', '#665191', '#7f7f00', '#bab0ac'];
  const variantColors = {'fused': '#59a14f', 'baseline': '#4e79a7', 'baseline:sdpa': '#76b7b2',
                         'peer:eager': '#f28e2b', 'peer:compile': '#e15759'};
  const variantColor = (v, i) => variantColors[v] || palette[(i + 5) % palette.length];
  const axis = (title, extra) => Object.assign({title: {display: true, text: title}}, extra || {});
  const us = (ns) => (ns / 1e3).toFixed(ns < 1e4 ? 3 : ns < 1e6 ? 2 : 1);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // Sortable tables: numbers by the cells' data-v (empty last), text otherwise; a second click reverses.
  document.querySelectorAll('table.sortable').forEach((table) => {
    const headers = Array.from(table.tHead.rows[0].cells);
    headers.forEach((th, column) => th.addEventListener('click', () => {
      const ascending = th.getAttribute('aria-sort') !== 'ascending';
      headers.forEach((h) => h.removeAttribute('aria-sort'));
      th.setAttribute('aria-sort', ascending ? 'ascending' : 'descending');
      const key = (row) => {
        const cell = row.cells[column];
        if (cell.dataset.v === undefined) return cell.textContent;
        return cell.dataset.v === '' ? null : Number(cell.dataset.v);
      };
      const body = table.tBodies[0];
      const rows = Array.from(body.rows);
      rows.sort((a, b) => {
        const x = key(a), y = key(b);
        if (x === null || y === null) return (x === null) - (y === null);
        const order = typeof x === 'number' ? x - y : x.localeCompare(y, undefined, {numeric: true});
        return ascending ? order : -order;
      });
      rows.forEach((row) => body.appendChild(row));
    }));
  });

  if (typeof Chart !== 'undefined') {
    Chart.defaults.animation = false;
    Chart.defaults.font.family = 'system-ui, sans-serif';
    // After each draw, the canvas says how many values it drew (data-points; reference lines left
    // out), so that a check in a browser can tell a chart that draws nothing.
    Chart.register({id: 'fusekit-points', afterDraw: (c) => {
      const drawn = (v) => v !== null && v !== undefined && !(typeof v === 'number' && !Number.isFinite(v));
      c.canvas.dataset.points = String(c.data.datasets.filter((d) => d.label !== 'as fast')
                                         .reduce((n, d) => n + d.data.filter(drawn).length, 0));
    }});
  }
  const chart = (id, config) => {
    const canvas = document.getElementById(id);
    if (canvas === null || typeof Chart === 'undefined') return null;
    config.options = Object.assign({responsive: true, maintainAspectRatio: false}, config.options);
    return new Chart(canvas, config);
  };

  data.ops.forEach((op, i) => {
    if (op.chart) {
      const values = op.chart.series.flatMap((s) => s.values).filter((v) => v > 0);
      const log = values.length > 0 && Math.max(...values) / Math.min(...values) > 30;
      const datasets = op.chart.series.map((s, k) => ({
        label: 'vs ' + s.variant, data: s.values, backgroundColor: variantColor(s.variant, k), skipNull: true,
      }));
      datasets.push({type: 'line', label: 'as fast', data: op.chart.labels.map(() => 1), borderColor: '#6b7480',
                     borderDash: [4, 4], borderWidth: 1, pointRadius: 0});
      chart('speedup-' + i, {type: 'bar', data: {labels: op.chart.labels, datasets: datasets}, options: {
        scales: {y: axis('speedup of fused (x)' + (log ? ', log scale' : ''), log ? {type: 'logarithmic'} : {min: 0}),
                 x: {ticks: {autoSkip: false, maxRotation: 50}}},
        plugins: {
          legend: {labels: {filter: (item) => item.text !== 'as fast'}},
          tooltip: {filter: (item) => item.dataset.type !== 'line', callbacks: {
            title: (items) => op.chart.cases[items[0].dataIndex],
            label: (item) => item.dataset.label + ': ' + item.parsed.y.toFixed(2) + 'x'}},
        },
      }});
    }
    if (op.history) {
      const select = document.getElementById('history-variant-' + i);
      const scale = document.getElementById('history-scale-' + i);
      const current = data.runs.findIndex((r) => r.current);
      const history = chart('history-' + i, {type: 'line', data: {labels: data.runs.map((r) => r.label), datasets: []},
        options: {plugins: {tooltip: {callbacks: {title: (items) => data.runs[items[0].dataIndex].title}}}}});
      // Relative: each case's median over its median in this report's run (or its latest), so that a change
      // of a few per cent shows whatever the case's size.
      const show = () => {
        if (history === null || select === null) return;
        const relative = scale === null || scale.value === 'relative';
        const series = op.history.cases.filter((c) => c.values[select.value]);
        history.data.datasets = series.map((c, k) => {
          const values = c.values[select.value];
          const known = values.filter((v) => v !== null);
          const reference = values[current] !== null && values[current] !== undefined ? values[current]
                                                                                       : known[known.length - 1];
          return {label: c.label, data: relative ? values.map((v) => (v === null ? null : v / reference)) : values,
                  medians: values, borderColor: palette[k % palette.length], backgroundColor: palette[k % palette.length],
                  spanGaps: true, tension: 0};
        });
        history.options.scales = {y: relative ? axis('median / this run\'s median') :
                                                axis('median (us), log scale', {type: 'logarithmic'})};
        history.options.plugins.tooltip.callbacks.label = (item) => {
          const median = item.dataset.medians[item.dataIndex];
          return item.dataset.label + ': ' + median.toFixed(3) + ' us' +
                 (relative ? ', ' + item.parsed.y.toFixed(3) + 'x this run\'s' : '');
        };
        history.update();
      };
      [select, scale].forEach((s) => { if (s !== null) s.addEventListener('change', show); });
      show();
    }
  });

  // A case's kernel block, built when first opened: a stacked bar per variant, then the shares side by side.
  const kernelBlock = (details) => {
    const c = data.cases[Number(details.dataset.case)];
    const box = details.querySelector('.kernels');
    if (!c || box === null || box.childElementCount > 0) return;
    const color = new Map();
    c.variants.forEach((v) => v.top.forEach(([k]) => {
      if (!color.has(k)) color.set(k, palette[color.size % palette.length]);
    }));
    const share = (v, ns) => (v.kernel_ns > 0 ? 100 * ns / v.kernel_ns : 0);
    const per = (v) => (v.reps > 0 ? ' a repetition' : ' in the traced range');
    const perRep = (v, x) => (v.reps > 0 ? x / v.reps : x);
    for (const v of c.variants) {
      const row = el('div', 'kbar-row');
      const label = el('div', 'kbar-label', v.variant);
      const launches = perRep(v, v.launches);
      label.appendChild(el('small', '', us(perRep(v, v.kernel_ns)) + ' us, ' +
                                         (Number.isInteger(launches) ? launches : launches.toFixed(1)) +
                                         (launches === 1 ? ' kernel' : ' kernels') + per(v)));
      const bar = el('div', 'kbar');
      const segment = (ns, background, text, title, cls) => {
        const s = el('span', cls, text);
        s.style.width = share(v, ns) + '%';
        s.style.background = background;
        s.title = title + '\n' + share(v, ns).toFixed(1) + ' % of ' + v.variant + '\'s kernel time, ' +
                  us(perRep(v, ns)) + ' us' + per(v);
        bar.appendChild(s);
      };
      v.top.forEach(([k, ns, n]) => segment(ns, color.get(k), data.names[k].short,
                                            data.names[k].name + '\n' + n + ' launches', ''));
      if (v.other_ns > 0) {
        segment(v.other_ns, '#c9ced4', 'other', v.other_kernels + ' other kernels', 'other');
      }
      row.append(label, bar);
      box.appendChild(row);
    }
    const table = el('table', 'kshares');
    const head = table.createTHead().insertRow();
    head.appendChild(el('th', '', 'Kernel'));
    c.variants.forEach((v) => {
      const th = el('th', 'num', v.variant);
      th.appendChild(el('small', '', '% of kernel time'));
      head.appendChild(th);
    });
    const body = table.createTBody();
    const addRow = (swatch, text, title, cell) => {
      const tr = body.insertRow();
      const name = el('td', 'name');
      const mark = el('span', 'swatch');
      mark.style.background = swatch;
      name.append(mark, text);
      name.title = title;
      tr.appendChild(name);
      c.variants.forEach((v) => tr.appendChild(cell(v)));
    };
    const shareCell = (v, ns, n) => {
      const td = el('td', 'num', ns === undefined ? '' : share(v, ns).toFixed(1));
      if (ns !== undefined) td.title = us(perRep(v, ns)) + ' us' + per(v) + (n ? ', ' + n + ' launches' : '');
      return td;
    };
    color.forEach((swatch, k) => addRow(swatch, data.names[k].short, data.names[k].name, (v) => {
      const entry = v.top.find(([index]) => index === k);
      return entry ? shareCell(v, entry[1], entry[2]) : shareCell(v, undefined);
    }));
    if (c.variants.some((v) => v.other_ns > 0)) {
      addRow('#c9ced4', 'other', 'the kernels of each variant not listed above',
             (v) => shareCell(v, v.other_ns > 0 ? v.other_ns : undefined));
    }
    box.appendChild(table);
  };
  document.querySelectorAll('details.case').forEach((details) => {
    details.addEventListener('toggle', () => { if (details.open) kernelBlock(details); });
    if (details.open) kernelBlock(details);
  });
  // A link to a case opens its block.
  const openTarget = () => {
    const target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    if (target !== null && target.tagName === 'DETAILS') target.open = true;
  };
  window.addEventListener('hashchange', openTarget);
  openTarget();

  if (data.kernels.length > 0) {
    const kernels = data.kernels.slice();
    if (data.other_kernels.count > 0) {
      kernels.push({name: data.other_kernels.count + ' other kernels', short: 'other',
                    percent: data.other_kernels.percent});
    }
    chart('chart-kernels', {type: 'bar', data: {
      labels: kernels.map((k) => (k.short.length > 48 ? k.short.slice(0, 47) + '\u2026' : k.short)),
      datasets: [{label: 'share of kernel time (%)', data: kernels.map((k) => k.percent), backgroundColor: palette[0]}],
    }, options: {
      indexAxis: 'y',
      scales: {x: axis('share of kernel time (%)', {beginAtZero: true})},
      plugins: {legend: {display: false}, tooltip: {callbacks: {
        title: (items) => kernels[items[0].dataIndex].name,
        label: (item) => item.parsed.x.toFixed(1) + ' % of kernel time',
      }}},
    }});
  }
})();
)JS";

}  // namespace fusekit::reports

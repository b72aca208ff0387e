const P = JSON.parse(document.getElementById('atlas-data').textContent);
const S = {model: (P.default_model in P.models) ? P.default_model : Object.keys(P.models)[0],
           lens: 'alpha', task: null, head: null, pair: null};
// ?all in the URL: every view draws at once (a headless full-page screenshot or a print shows them all)
const DRAW_ALL = new URLSearchParams(location.search).has('all');
const MAX_HEAD_TICKS = 64;  // as sitelens.atlas.views.MAX_HEAD_TICKS
const cfg = {displaylogo: false, responsive: true};
function M() { return P.models[S.model]; }
function label(l, h) { return 'L' + l + 'H' + h; }
function fmt(x) { return (x === null || x === undefined) ? '—' : Number(x).toFixed(4); }

// ---- lookups: the same as sitelens.atlas.views ----
function headCard(model, task, l, h) {
  const m = P.models[model]; const i = l * m.n_heads + h;
  const scores = {};
  for (const lens of Object.keys(m.lenses)) {
    const v = m.lenses[lens]; scores[lens] = (task in v) ? v[task][i] : null;
  }
  const ci = m.alpha_ci[task] || [[null], [null]];
  return {head: label(l, h), model: model, task: task, scores: scores,
          alpha_ci: [ci[0][i], ci[1][i]], n_seeds: m.n_seeds[task],
          alpha_across_tasks: m.order.map(t => [t, m.lenses.alpha[t][i]]),
          tokens: (m.tokens[task] || [])[i] || [], minimal: headMinimal(model, l, h)};
}
function headMinimal(model, l, h) {
  const m = P.models[model]; const mm = m.minimal || {}; const i = l * m.n_heads + h;
  const per = mm.tasks || {}; const out = {};
  for (const sel of (mm.selectors || []))
    out[sel] = m.order.filter(t => (((per[t] || {}).sets || {})[sel] || []).includes(i));
  return out;
}
function minimalSelector(model, lens) {
  const sels = (P.models[model].minimal || {}).selectors || [];
  return sels.includes(lens) ? lens : (sels.includes('alpha') ? 'alpha' : (sels.length ? sels[0] : null));
}
function minimalSet(model, task, sel) {
  const m = P.models[model]; const t = ((m.minimal || {}).tasks || {})[task] || {};
  return ((t.sets || {})[sel] || []).map(j => [Math.floor(j / m.n_heads), j % m.n_heads]);
}
function minimalView(model) {
  const m = P.models[model]; const mm = m.minimal || {}; const per = mm.tasks || {};
  const sels = mm.selectors || []; const rows = m.order.filter(t => t in per);
  const k = (t, s) => per[t].k_star[s];
  return {tasks: rows, selectors: sels,
          z: rows.map(t => sels.map(s => Number.isInteger(k(t, s)) ? k(t, s) : null)),
          text: rows.map(t => sels.map(s => k(t, s) === undefined ? '—' : String(k(t, s)))),
          note: mm.note || (rows.length ? '' : 'No task has a minimal set.'), skipped: mm.skipped || {}};
}
function taskMap(model, task, lens) {
  const m = P.models[model]; const H = m.n_heads;
  const flat = ((m.lenses[lens] || {})[task]) || new Array(m.n_layers * H).fill(null);
  const out = []; for (let r = 0; r < m.n_layers; r++) out.push(flat.slice(r * H, (r + 1) * H));
  return out;
}
function pairView(model, a, b) {
  const m = P.models[model]; const ia = m.tasks.indexOf(a), ib = m.tasks.indexOf(b);
  const ma = taskMap(model, a, 'alpha'), mb = taskMap(model, b, 'alpha');
  const diff = ma.map((row, r) => row.map((x, c) => Math.round((x - mb[r][c]) * 1e4) / 1e4));
  return {a: a, b: b, alpha_a: ma, alpha_b: mb, diff: diff, similarity: m.similarity[ia][ib],
          transfer: m.transfer[ia][ib], zero_shot_b: m.zero_shot[ib]};
}
function overview(model, lens) {
  const m = P.models[model];
  const rows = m.order.filter(t => (m.lenses[lens] || {})[t] !== undefined);
  const heads = []; for (let i = 0; i < m.n_layers * m.n_heads; i++)
    heads.push(label(Math.floor(i / m.n_heads), i % m.n_heads));
  const ticks = heads.length <= MAX_HEAD_TICKS ? heads : heads.filter((_, i) => i % m.n_heads === 0);
  return {tasks: rows, z: rows.map(t => m.lenses[lens][t]), heads: heads, ticks: ticks};
}

// ---- rendering ----
function drawn(id) { const el = document.getElementById(id); delete pending[id]; io.unobserve(el);
  el.dataset.drawnAt = performance.now().toFixed(1); el.dataset.drawn = '1'; }
function fillSelect(id, values, current) {
  const el = document.getElementById(id); el.innerHTML = '';
  for (const v of values) { const o = document.createElement('option'); o.value = v; o.textContent = v;
    if (v === current) o.selected = true; el.appendChild(o); }
}
function lensesOf(model) { return P.lens_order.filter(x => x in P.models[model].lenses); }
function colorscale(lens) { return lens === 'alpha' ? 'Viridis' : 'RdBu'; }
function zrange(lens) { return lens === 'alpha' ? {zmin: 0, zmax: 1} : {zmid: 0}; }

function renderOverview() {
  const o = overview(S.model, S.lens);
  const el = document.getElementById('overview');
  if (!o.tasks.length) { Plotly.purge(el); el.innerHTML = '<p class="note">No task has ' + S.lens + '.</p>'; return; }
  el.innerHTML = '';
  Plotly.newPlot(el, [Object.assign({type: 'heatmap', z: o.z, x: o.heads, y: o.tasks,
      colorscale: colorscale(S.lens), reversescale: S.lens !== 'alpha',
      hovertemplate: '%{y} · %{x}: %{z:.4f}<extra>' + S.lens + '</extra>'}, zrange(S.lens))],
    {title: {text: S.model + ': ' + S.lens + ' per head (tasks clustered by α similarity)', font: {size: 14}},
     height: Math.max(300, 160 + 11 * o.tasks.length), margin: {l: 170, r: 20, t: 40, b: 80},
     xaxis: {tickmode: 'array', tickvals: o.ticks, tickangle: -90, tickfont: {size: 8},
             title: {text: 'head (L layer, H head)', standoff: 4}},
     yaxis: {autorange: 'reversed', tickfont: {size: 9}}},
    cfg);
  el.on('plotly_click', ev => { const pt = ev.points[0]; const i = o.heads.indexOf(pt.x);
    S.task = pt.y; document.getElementById('task').value = S.task;
    renderTask(); showCard(Math.floor(i / M().n_heads), i % M().n_heads); });
}
function renderTask() {
  const m = M(); const z = taskMap(S.model, S.task, S.lens);
  const text = z.map((row, l) => row.map((v, h) => label(l, h) + ': ' + fmt(v)));
  const el = document.getElementById('taskmap');
  const sel = minimalSelector(S.model, S.lens); const ms = minimalSet(S.model, S.task, sel);
  const ks = sel ? ((((m.minimal || {}).tasks || {})[S.task] || {}).k_star || {})[sel] : undefined;
  el.dataset.minimal = ms.map(([l, h]) => label(l, h)).join(';');
  const traces = [Object.assign({type: 'heatmap', z: z, text: text, hovertemplate: '%{text}<extra></extra>',
      colorscale: colorscale(S.lens), reversescale: S.lens !== 'alpha'}, zrange(S.lens))];
  if (ms.length) traces.push({type: 'scatter', mode: 'markers', x: ms.map(p => p[1]), y: ms.map(p => p[0]),
      hoverinfo: 'skip', showlegend: false, name: 'minimal set',
      marker: {symbol: 'x-thin-open', size: 11, color: '#ff00ff', line: {width: 3, color: '#ff00ff'}}});
  const sub = ks === undefined ? '' : ' · × minimal set of ' + sel + ' (k* = ' + ks + ')';
  Plotly.newPlot(el, traces,
    {title: {text: S.task + ': ' + S.lens + sub, font: {size: 14}}, width: 120 + 36 * m.n_heads + 120,
     height: Math.max(320, 100 + 14 * m.n_layers), margin: {l: 50, r: 10, t: 40, b: 40},
     xaxis: {title: 'head', dtick: 1}, yaxis: {title: 'layer', autorange: 'reversed', dtick: 1}}, cfg);
  el.on('plotly_click', ev => { const pt = ev.points[0]; showCard(pt.y, pt.x); });
  drawn('taskmap');
}
function showCard(l, h) {
  S.head = [l, h];
  const c = headCard(S.model, S.task, l, h);
  const el = document.getElementById('card');
  el.dataset.head = c.head; el.dataset.task = c.task; el.dataset.model = c.model;
  let rows = '';
  for (const lens of lensesOf(S.model)) rows += '<tr data-lens="' + lens + '"><td>' + lens +
    '</td><td class="v">' + fmt(c.scores[lens]) + '</td></tr>';
  const toks = c.tokens.map(t => '<span>' + t.replace(/&/g, '&amp;').replace(/</g, '&lt;') + '</span>').join('');
  el.innerHTML = '<h2>' + c.head + ' <span class="note">' + c.model + ' · ' + c.task + '</span></h2>' +
    '<p class="note">α 95% interval over ' + c.n_seeds + ' seed(s): <span id="card-ci">[' +
    fmt(c.alpha_ci[0]) + ', ' + fmt(c.alpha_ci[1]) + ']</span></p>' +
    '<table id="card-scores">' + rows + '</table>' +
    '<p class="note">Top tokens its injected vector promotes (t·W_O → unembedding):</p>' +
    '<div class="tokens" id="card-tokens">' + toks + '</div>' + minimalRows(c) + '<div id="card-across"></div>';
  const xs = c.alpha_across_tasks.map(r => r[0]), ys = c.alpha_across_tasks.map(r => r[1]);
  Plotly.newPlot('card-across', [{type: 'bar', x: xs, y: ys, marker: {color: xs.map(t => t === S.task ? '#d62728' : '#1f77b4')}}],
    {title: {text: 'α of ' + c.head + ' in every task', font: {size: 12}}, height: 260,
     margin: {l: 40, r: 10, t: 30, b: 90}, xaxis: {tickfont: {size: 8}}, yaxis: {range: [0, 1]}}, cfg);
  drawn('card');
}
function minimalRows(c) {
  const sels = Object.keys(c.minimal);
  if (!sels.length) return '';
  return '<p class="note">Tasks whose minimal set (k*) holds ' + c.head + ':</p><table id="card-minimal">' +
    sels.map(s => '<tr data-selector="' + s + '"><td>' + s + '</td><td class="v">' + c.minimal[s].length +
      '</td><td class="tasks">' + c.minimal[s].join(', ') + '</td></tr>').join('') + '</table>';
}
function renderMinimal() {
  const v = minimalView(S.model); const el = document.getElementById('minimal');
  el.dataset.tasks = v.tasks.length;
  if (!v.tasks.length) { Plotly.purge(el); el.innerHTML = '<p class="note" id="minimal-note">' + v.note + '</p>'; return; }
  el.innerHTML = '';
  const n = Object.keys(v.skipped).length; const b = (M().minimal || {}).budgets || [];
  const gaps = v.z.map(row => row.map(z => z === null ? 1 : null));  // not reached: a grey cell
  Plotly.newPlot(el, [{type: 'heatmap', z: v.z, x: v.selectors, y: v.tasks, text: v.text, texttemplate: '%{text}',
      colorscale: 'Viridis', reversescale: true, hoverongaps: false,
      hovertemplate: '%{y} · %{x}: k* = %{text}<extra></extra>', colorbar: {title: {text: 'k*'}}},
    {type: 'heatmap', z: gaps, x: v.selectors, y: v.tasks, text: v.text, texttemplate: '%{text}',
      colorscale: [[0, '#dddddd'], [1, '#dddddd']], showscale: false, hoverongaps: false,
      hovertemplate: '%{y} · %{x}: not reached<extra></extra>'}],
    {title: {text: S.model + ': k*, the fewest heads reaching 90% of full SITE<br>(top-k of each selector, ' +
       'α = 1 on the set; grey: not reached with k ≤ ' + (b.length ? b[b.length - 1] : '—') + ')' +
       (n ? ' · ' + n + ' task(s) skipped' : ''), font: {size: 13}},
     height: Math.max(300, 180 + 14 * v.tasks.length), width: 640, margin: {l: 170, r: 20, t: 70, b: 40},
     yaxis: {autorange: 'reversed', tickfont: {size: 9}}}, cfg);
  el.on('plotly_click', ev => { const pt = ev.points[0]; S.task = pt.y;
    document.getElementById('task').value = S.task; lazy('taskmap', renderTask);
    if (S.head) showCard(S.head[0], S.head[1]); });
}
function renderSimilarity() {
  const m = M(); const idx = m.order.map(t => m.tasks.indexOf(t));
  const z = idx.map(i => idx.map(j => m.similarity[i][j]));
  const el = document.getElementById('sim');
  Plotly.newPlot(el, [{type: 'heatmap', z: z, x: m.order, y: m.order, zmin: -1, zmax: 1, colorscale: 'RdBu', reversescale: true,
      hovertemplate: 'A = %{y}<br>B = %{x}<br>ρ = %{z:.3f}<extra></extra>'}],
    {title: {text: 'α similarity (Spearman ρ); click a cell for the pair', font: {size: 14}},
     width: 560, height: 560, margin: {l: 150, r: 10, t: 40, b: 150},
     xaxis: {tickfont: {size: 8}}, yaxis: {tickfont: {size: 8}, autorange: 'reversed'}}, cfg);
  el.on('plotly_click', ev => { const pt = ev.points[0]; renderPair(pt.y, pt.x); });
  drawn('sim');
}
function renderPair(a, b) {
  S.pair = [a, b];
  const v = pairView(S.model, a, b);
  const el = document.getElementById('pair');
  el.dataset.a = a; el.dataset.b = b;
  const hm = (z, xa, ya, cs, extra) => Object.assign({type: 'heatmap', z: z, xaxis: xa, yaxis: ya,
      colorscale: cs, showscale: false}, extra);
  Plotly.newPlot(el, [hm(v.alpha_a, 'x', 'y', 'Viridis', {zmin: 0, zmax: 1, name: a}),
                      hm(v.alpha_b, 'x2', 'y2', 'Viridis', {zmin: 0, zmax: 1, name: b}),
                      hm(v.diff, 'x3', 'y3', 'RdBu', {zmid: 0, zmin: -1, zmax: 1, name: 'A − B'})],
    {grid: {rows: 1, columns: 3, pattern: 'independent'}, height: 420, width: 640,
     title: {text: 'A = ' + a + ' · B = ' + b + ' · ρ = ' + fmt(v.similarity) + ' · B through A\'s α: ' +
       fmt(v.transfer) + ' (B zero-shot ' + fmt(v.zero_shot_b) + ')', font: {size: 12}},
     annotations: [['α of A', 0.14], ['α of B', 0.5], ['A − B', 0.86]].map(([t, x]) => ({text: t, x: x, y: 1.0,
       xref: 'paper', yref: 'paper', showarrow: false, yanchor: 'bottom'})),
     yaxis: {autorange: 'reversed'}, yaxis2: {autorange: 'reversed'}, yaxis3: {autorange: 'reversed'},
     margin: {l: 30, r: 10, t: 60, b: 30}}, cfg);
  drawn('pair');
}
function renderDepth() {
  const traces = Object.values(P.models).map(m => ({type: 'bar', name: m.model,
    x: m.depth_mass.map((_, i) => (i * 10) + '–' + ((i + 1) * 10) + '%'), y: m.depth_mass}));
  Plotly.newPlot('depth', traces, {barmode: 'group', height: 320,
    title: {text: 'Share of α mass per relative-depth decile (mean over tasks)', font: {size: 14}},
    xaxis: {title: 'layer depth (share of the model)'}, yaxis: {title: 'share of Σα'},
    margin: {l: 50, r: 10, t: 40, b: 50}}, cfg);
}
function renderSummary() {
  const s = M().summary; const c = (s.similarity_vs_transfer || {}).alpha || {};
  const f = s.family_test || {};
  document.getElementById('summary').textContent = S.model + ': ' + s.n_tasks + ' tasks. α similarity vs transfer: ' +
    'Spearman ρ = ' + fmt(c.rho) + ' (Mantel p = ' + fmt(c.p_value) + ', ' + c.n_pairs + ' ordered pairs). ' +
    'Within- minus between-family α similarity: ' + fmt(f.gap) + ' (permutation p = ' + fmt(f.p_value) + ').';
}
// Views below the first screen draw when scrolled near (plotly.js itself is most of the open time;
// drawing only what is seen keeps the first paint to one plot). A drawn view has data-drawn="1".
// Every view still waiting draws at once with ?all in the URL, before printing, or on
// window.atlasDrawAll() (what a screenshot script calls).
const pending = {};
function drawNow(id) { const f = pending[id]; if (f) { delete pending[id]; f(); drawn(id); } }
const io = new IntersectionObserver(entries => { for (const e of entries) {
  const id = e.target.id, f = pending[id];
  // after a frame, so that what is already drawn paints before the next view is computed
  if (e.isIntersecting && f) { io.unobserve(e.target);
    requestAnimationFrame(() => setTimeout(() => { if (pending[id] === f) drawNow(id); }, 0)); }
} }, {rootMargin: '150px'});
function lazy(id, f) {
  const el = document.getElementById(id);
  if (el.dataset.drawn === '1') { f(); return; }
  pending[id] = f;
  if (DRAW_ALL) drawNow(id); else io.observe(el);
}
function drawAll() { for (const id of Object.keys(pending)) drawNow(id); }
window.atlasDrawAll = drawAll;
window.addEventListener('beforeprint', drawAll);
window.matchMedia('print').addEventListener('change', e => { if (e.matches) drawAll(); });
function renderModel() {
  fillSelect('lens', lensesOf(S.model), S.lens);
  if (!(S.lens in M().lenses)) S.lens = 'alpha';
  S.task = M().order[0]; fillSelect('task', M().order, S.task);
  renderSummary(); renderOverview(); drawn('overview');
  lazy('taskmap', renderTask); lazy('card', () => showCard(S.head ? S.head[0] : 0, S.head ? S.head[1] : 0));
  lazy('minimal', renderMinimal); lazy('sim', renderSimilarity);
  const first = M().order[0], second = M().order[Math.min(1, M().order.length - 1)];
  lazy('pair', () => renderPair(S.pair ? S.pair[0] : first, S.pair ? S.pair[1] : second));
}
fillSelect('model', Object.keys(P.models), S.model);
document.getElementById('model').onchange = e => { S.model = e.target.value; S.head = null; S.pair = null; renderModel(); };
document.getElementById('lens').onchange = e => { S.lens = e.target.value; renderOverview(); lazy('taskmap', renderTask);
  if (S.head) showCard(S.head[0], S.head[1]); };
document.getElementById('task').onchange = e => { S.task = e.target.value; lazy('taskmap', renderTask);
  if (S.head) showCard(S.head[0], S.head[1]); };
renderModel(); lazy('depth', renderDepth);
window.atlasReadyAt = performance.now();  // ms from navigation start: the first view is drawn
window.atlasReady = true;

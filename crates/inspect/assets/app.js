// The inspection page of policy-serving. Plain JavaScript, no dependencies.
// Every piece of server data reaches the page through text nodes (el(), textContent) or numeric
// SVG attributes: conversation text is untrusted and is never parsed as HTML.
'use strict';

const KEY = 'policy-serving-admin-key';
const view = document.getElementById('view');
const statusLine = document.getElementById('status');
const tip = document.getElementById('tip');
let timer = null;
let renderId = 0;
const lagHistory = [];

// ---- DOM helpers ----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'style') e.style.cssText = v; // CSSOM: allowed by the page's CSP, unlike style attributes
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmt(n, digits = 2) {
  if (n === undefined || n === null) return '–';
  if (typeof n !== 'number') return String(n);
  return Number.isInteger(n) ? n.toLocaleString('en') : n.toFixed(digits);
}

function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  return Math.round(s / 3600) + ' h ago';
}

function lp4(v) {
  return v === null || v === undefined ? null : v.toFixed(4);
}

function votes(v) {
  if (!Array.isArray(v)) return '–';
  return v.map((x) => (x === null ? 'failed' : x > 0 ? '+' + x : String(x))).join(' ');
}

function setStatus(text, error) {
  statusLine.textContent = text;
  statusLine.className = error ? 'error' : '';
}

// ---- the admin key ----------------------------------------------------------------------------

let keyWaiter = null;

function askKey(message) {
  if (keyWaiter) return keyWaiter;
  const form = document.getElementById('key-form');
  const input = document.getElementById('key-input');
  document.getElementById('key-message').textContent = message || '';
  form.hidden = false;
  view.hidden = true;
  input.focus();
  keyWaiter = new Promise((resolve) => {
    form.onsubmit = (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(KEY, input.value);
      input.value = '';
      form.hidden = true;
      view.hidden = false;
      keyWaiter = null;
      resolve();
    };
  });
  return keyWaiter;
}

async function api(path) {
  for (;;) {
    const key = sessionStorage.getItem(KEY);
    const headers = { Accept: 'application/json' };
    if (key !== null) headers.Authorization = 'Bearer ' + key;
    const r = await fetch(new URL('../' + path, location.href), { headers });
    if (r.status === 401) {
      sessionStorage.removeItem(KEY);
      await askKey(key === null ? '' : 'That key was refused. Enter the admin key.');
      continue;
    }
    const body = await r.json().catch(() => null);
    if (!r.ok) {
      const msg = body && body.error ? body.error.message : r.status + ' ' + r.statusText;
      const err = new Error(msg);
      err.status = r.status;
      throw err;
    }
    return body;
  }
}

// ---- charts -----------------------------------------------------------------------------------

const SVG = 'http://www.w3.org/2000/svg';

function chart(title, values, unit) {
  const w = 300;
  const h = 60;
  const nums = values.filter((v) => v !== null && v !== undefined);
  const max = Math.max(1e-9, ...nums);
  const min = Math.min(0, ...nums);
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const axis = document.createElementNS(SVG, 'line');
  const zero = h - ((0 - min) / (max - min || 1)) * h;
  for (const [k, v] of [['x1', 0], ['x2', w], ['y1', zero], ['y2', zero], ['class', 'axis']]) axis.setAttribute(k, v);
  svg.append(axis);
  const pts = [];
  values.forEach((v, i) => {
    if (v === null || v === undefined) return;
    const x = values.length > 1 ? (i / (values.length - 1)) * w : w;
    const y = h - ((v - min) / (max - min || 1)) * (h - 4) - 2;
    pts.push(x.toFixed(1) + ',' + y.toFixed(1));
  });
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('points', pts.join(' '));
  svg.append(line);
  if (pts.length) {
    // The newest value as a dot, so that a single point shows too.
    const [cx, cy] = pts[pts.length - 1].split(',');
    const dot = document.createElementNS(SVG, 'circle');
    for (const [k, v] of [['cx', cx], ['cy', cy], ['r', 2.5]]) dot.setAttribute(k, v);
    svg.append(dot);
  }
  const last = nums.length ? nums[nums.length - 1] : null;
  return el('div', { class: 'card chart' },
    el('div', { class: 'label' }, title),
    el('div', { class: 'sub' }, 'now ' + fmt(last) + (unit ? ' ' + unit : '') + ' · max ' + fmt(nums.length ? Math.max(...nums) : null)),
    svg);
}

// ---- views ------------------------------------------------------------------------------------

function card(label, value, sub, id) {
  return el('div', { class: 'card', id }, el('div', { class: 'label' }, label), el('div', { class: 'value' }, value), sub ? el('div', { class: 'sub' }, sub) : null);
}

function countTable(title, column, map, id) {
  const rows = Object.entries(map || {}).sort((a, b) => b[1] - a[1]);
  return el('div', { id },
    el('h2', {}, title),
    rows.length
      ? el('table', {}, el('tr', {}, el('th', {}, column), el('th', { class: 'num' }, 'turns')),
        rows.map(([k, v]) => el('tr', {}, el('td', {}, k), el('td', { class: 'num' }, fmt(v)))))
      : el('p', { class: 'muted' }, 'none'));
}

async function overview(id) {
  const o = await api('v1/inspect/overview');
  if (id !== renderId) return;
  if (o.store) {
    lagHistory.push(o.store.lag);
    if (lagHistory.length > 300) lagHistory.shift();
  }
  const live = o.live;
  const t = o.totals;
  const submission = live ? (live.submission_enabled ? 'enabled' : 'paused') : '–';
  view.replaceChildren(
    el('h1', {}, 'Overview'),
    el('div', { class: 'cards' },
      card('Requests / s', fmt(o.requests_per_s), fmt(t.requests) + ' requests (' + fmt(t.main_turns) + ' main, ' + fmt(t.side_turns) + ' side)', 'card-requests'),
      card('Samples / s', fmt(o.samples_per_s), fmt(t.samples) + ' stored, ' + fmt(t.excluded) + ' excluded', 'card-samples'),
      card('Trainer lag', o.store ? fmt(o.store.lag) : '–', o.store ? 'stored ' + fmt(o.store.last_seq) + ' · committed ' + fmt(o.store.committed) : (o.store_error || 'no store'), 'card-lag'),
      card('Submission', submission, live ? 'pause mode ' + live.pause_mode + ' · mode ' + live.mode : '', 'card-submission'),
      card('Live sessions', live ? fmt(live.live_sessions) : '–', 'history holds ' + fmt(o.history.sessions) + ' of ' + fmt(o.history.max_sessions), 'card-sessions'),
      card('Teacher mismatches', fmt(t.teacher_mismatches), 'turns dropped: teacher scored other ids', 'card-mismatch')),
    el('h2', {}, 'Last ' + Math.round((o.series.length * o.bucket_ms) / 60000) + ' minutes (' + o.bucket_ms / 1000 + ' s buckets)'),
    el('div', { class: 'charts' },
      chart('Requests per bucket', o.series.map((p) => p.requests)),
      chart('Samples per bucket', o.series.map((p) => p.samples)),
      chart('Dropped or abandoned turns', o.series.map((p) => p.drops)),
      chart('PRM eval score (mean reward)', o.series.map((p) => (p.mean_reward === undefined ? null : p.mean_reward))),
      chart('Trainer lag (since this page opened)', lagHistory.slice(), 'samples')),
    el('div', { class: 'tables' },
      countTable('Pending turns by state', 'state', live ? live.pending : {}, 'pending'),
      countTable('Dropped turns by reason', 'reason', t.dropped, 'dropped'),
      countTable('Abandoned turns by reason', 'reason', t.abandoned, 'abandoned')));
  schedule(id, 2000);
}

async function sessions(id, params) {
  const q = params.get('q') || '';
  const list = await api('v1/inspect/sessions?limit=500&q=' + encodeURIComponent(q));
  if (id !== renderId) return;
  const input = el('input', { id: 'session-search', type: 'search', placeholder: 'search by session id', value: q });
  let debounce = null;
  input.addEventListener('input', () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { location.hash = '#/sessions?q=' + encodeURIComponent(input.value); }, 300);
  });
  view.replaceChildren(
    el('h1', {}, 'Sessions'),
    el('div', { class: 'search' }, input, el('span', { class: 'muted' }, fmt(list.matched) + ' of ' + fmt(list.total) + ' sessions held')),
    el('table', { id: 'sessions' },
      el('tr', {}, ['session', 'source', 'state', 'requests', 'main turns', 'samples', 'drops', 'last activity'].map((h, i) => el('th', { class: i >= 3 && i <= 6 ? 'num' : '' }, h))),
      list.sessions.map((s) => el('tr', {},
        el('td', { class: 'wrap' }, el('a', { href: '#/session/' + encodeURIComponent(s.id) }, s.id)),
        el('td', {}, s.source),
        el('td', {}, el('span', { class: 'badge ' + s.state }, s.state + (s.closed_reason ? ': ' + s.closed_reason : ''))),
        el('td', { class: 'num' }, fmt(s.requests)),
        el('td', { class: 'num' }, fmt(s.main_turns)),
        el('td', { class: 'num' }, fmt(s.samples)),
        el('td', { class: 'num' }, fmt(s.drops)),
        el('td', {}, ago(s.last_ms))))));
  if (q) { input.focus(); input.setSelectionRange(q.length, q.length); }
  schedule(id, 5000);
}

async function timeline(id, sessionId) {
  const tl = await api('v1/inspect/sessions/' + encodeURIComponent(sessionId));
  if (id !== renderId) return;
  const s = tl.session;
  view.replaceChildren(
    el('h1', {}, 'Session ', el('span', { class: 'mono', id: 'session-id' }, s.id)),
    el('div', { class: 'facts' },
      fact('source', s.source), fact('state', s.state + (s.closed_reason ? ' (' + s.closed_reason + ')' : '')),
      fact('requests', fmt(s.requests)), fact('main turns', fmt(s.main_turns)), fact('samples', fmt(s.samples)),
      fact('drops', fmt(s.drops)), fact('first seen', new Date(s.first_ms).toLocaleString()),
      tl.turns_forgotten ? fact('older requests not held', fmt(tl.turns_forgotten)) : null),
    el('table', { id: 'timeline' },
      el('tr', {}, ['turn', 'type', 'status', 'PRM votes', 'hint votes', 'hint', 'teacher', 'why', 'sample', 'at'].map((h) => el('th', {}, h))),
      tl.turns.map((t) => el('tr', { class: 'turn', 'data-turn': t.turn === null ? '' : t.turn },
        el('td', { class: 'num' }, t.turn === null ? '–' : t.turn),
        el('td', {}, el('span', { class: 'badge ' + t.turn_type }, t.turn_type), t.streamed ? el('span', { class: 'muted' }, ' streamed') : null,
          t.door && t.door !== 'chat_completions' ? el('span', { class: 'muted' }, ' via ' + t.door) : null),
        el('td', {}, el('span', { class: 'badge ' + t.status }, t.status.replace(/_/g, ' '))),
        el('td', { class: 'votes' }, t.prm_votes ? votes(t.prm_votes) + ' → ' + fmt(t.prm_score) : '–'),
        el('td', { class: 'hint-votes' }, t.hint_votes ? votes(t.hint_votes) : '–'),
        el('td', { class: 'wrap hint' }, t.hint || '–'),
        el('td', { class: 'wrap' }, t.teacher ? t.teacher.outcome + (t.teacher.detail ? ': ' + t.teacher.detail : '') : '–'),
        el('td', { class: 'wrap reason' }, t.reason ? t.reason + (t.detail ? ': ' + t.detail : '') : ''),
        el('td', {}, t.seq ? el('a', { href: '#/sample/' + t.seq, class: 'sample-link' }, 'seq ' + t.seq + (t.reward !== undefined ? ' (reward ' + fmt(t.reward) + ')' : '')) : ''),
        el('td', { class: 'muted' }, new Date(t.at_ms).toLocaleTimeString())))));
  schedule(id, 3000);
}

function fact(label, value) {
  return el('div', {}, el('span', {}, label), value);
}

// ---- the sample view --------------------------------------------------------------------------

const COLOURINGS = {
  mask: { label: 'Loss mask', needs: () => true },
  rollout: { label: 'Rollout log-prob', needs: () => true },
  teacher: { label: 'Teacher log-prob', needs: (s) => s.has_teacher },
  adv: { label: 'OPD advantage (teacher − rollout)', needs: (s) => s.has_teacher },
};

// Probability colour: red (p = 0) to green (p = 1), by exp(log-prob).
function probColour(lp) {
  const p = Math.exp(Math.min(0, lp));
  return `hsl(${Math.round(120 * p)}, 70%, 78%)`;
}

function advColour(a) {
  const m = Math.min(2, Math.abs(a)) / 2;
  const light = Math.round(96 - 36 * m);
  return a >= 0 ? `hsl(215, 80%, ${light}%)` : `hsl(0, 80%, ${light}%)`;
}

function colourOf(t, by) {
  switch (by) {
    case 'mask': return t.mask ? 'hsl(140, 55%, 78%)' : 'hsl(0, 0%, 88%)';
    case 'rollout': return t.lp === null || t.lp === undefined ? null : probColour(t.lp);
    case 'teacher': return t.teacher_lp === undefined ? null : probColour(t.teacher_lp);
    default: return t.adv === undefined ? null : advColour(t.adv);
  }
}

function legend(by) {
  const sw = (style, cls) => el('span', { class: 'swatch ' + (cls || ''), style });
  const items = {
    mask: [[sw('background: hsl(140, 55%, 78%)'), 'trained (1)'], [sw('background: hsl(0, 0%, 88%)'), 'not trained (0)']],
    rollout: [[sw('background: linear-gradient(90deg, hsl(0,70%,78%), hsl(60,70%,78%), hsl(120,70%,78%))', 'gradient'), 'p = exp(log-prob): 0 → 1'], [sw('', 'tok none'), 'no log-prob']],
    teacher: [[sw('background: linear-gradient(90deg, hsl(0,70%,78%), hsl(60,70%,78%), hsl(120,70%,78%))', 'gradient'), 'teacher p: 0 → 1'], [sw('', 'tok none'), 'no value']],
    adv: [[sw('background: linear-gradient(90deg, hsl(0,80%,60%), hsl(0,0%,96%), hsl(215,80%,60%))', 'gradient'), 'teacher − rollout: −2 → +2'], [sw('', 'tok none'), 'no value']],
  }[by];
  return el('div', { class: 'legend', id: 'legend' }, items.map(([s, t]) => el('span', {}, s, t)),
    el('span', {}, el('span', { class: 'swatch', style: 'border: 2px dashed #b3261e' }), 'marked position'));
}

function shown(text) {
  if (text === undefined || text === null) return null;
  return text.replace(/\n/g, '↵').replace(/\t/g, '⇥') || '∅';
}

function tipFor(t, i) {
  const row = (k, v) => el('tr', {}, el('th', {}, k), el('td', { class: 'mono' }, v));
  const top = (t.top || []).map((c) => el('tr', {}, el('td', { class: 'mono' }, String(c.id)), el('td', { class: 'mono' }, c.text === undefined ? '' : JSON.stringify(c.text)), el('td', { class: 'mono' }, lp4(c.lp))));
  return [
    el('table', {},
      row('position', String(i)),
      row('id', String(t.id)),
      row('text', t.text === undefined ? '(no tokenizer)' : JSON.stringify(t.text)),
      row('loss mask', String(t.mask)),
      row('rollout log-prob', lp4(t.lp) || 'none'),
      row('teacher log-prob', lp4(t.teacher_lp) || '–'),
      row('advantage', lp4(t.adv) || '–'),
      row('source', t.source),
      t.marks && t.marks.length ? row('marked', t.marks.join(', ')) : null),
    top.length ? el('div', {}, el('div', { class: 'muted' }, 'teacher top-' + top.length), el('table', {}, top)) : null,
    t.experts ? el('div', {}, el('div', { class: 'muted' }, 'routed experts (layer: experts)'),
      el('table', {}, t.experts.map((ex, l) => row('layer ' + l, ex.join(', '))))) : null,
  ];
}

function showTip(chip, t, i) {
  tip.replaceChildren(...tipFor(t, i).filter(Boolean));
  tip.hidden = false;
  const r = chip.getBoundingClientRect();
  const w = tip.offsetWidth;
  tip.style.left = Math.max(4, Math.min(window.innerWidth - w - 4, r.left)) + 'px';
  const below = r.bottom + 6;
  tip.style.top = (below + tip.offsetHeight > window.innerHeight ? r.top - tip.offsetHeight - 6 : below) + 'px';
}

async function sample(id, seq) {
  const s = await api('v1/inspect/samples/' + encodeURIComponent(seq));
  if (id !== renderId) return;
  let by = s.has_teacher ? 'adv' : 'rollout';
  const chips = [];
  const box = el('div', { id: 'tokens' });
  let pinned = null;
  s.tokens.forEach((t, i) => {
    const label = t.text === undefined ? '#' + t.id : shown(t.text);
    const chip = el('span', { class: 'tok' + (t.marks && t.marks.length ? ' marked' : ''), 'data-i': i, tabindex: 0 }, label);
    chips.push(chip);
    box.append(chip);
    if (t.text && t.text.includes('\n')) box.append(el('br'));
  });
  // One set of listeners for every chip (a response may have thousands).
  const chipOf = (ev) => {
    const c = ev.target.closest && ev.target.closest('.tok');
    return c && box.contains(c) ? c : null;
  };
  const tokenOf = (c) => s.tokens[Number(c.dataset.i)];
  box.addEventListener('mouseover', (ev) => { const c = chipOf(ev); if (c && !pinned) showTip(c, tokenOf(c), Number(c.dataset.i)); });
  box.addEventListener('mouseout', (ev) => { const c = chipOf(ev); if (c && !pinned) tip.hidden = true; });
  box.addEventListener('focusin', (ev) => { const c = chipOf(ev); if (c) showTip(c, tokenOf(c), Number(c.dataset.i)); });
  box.addEventListener('click', (ev) => {
    const c = chipOf(ev);
    if (!c) return;
    if (pinned) pinned.classList.remove('pinned');
    pinned = pinned === c ? null : c;
    if (pinned) { c.classList.add('pinned'); showTip(c, tokenOf(c), Number(c.dataset.i)); } else tip.hidden = true;
  });
  const legendSlot = el('div');
  const paint = () => {
    s.tokens.forEach((t, i) => {
      const c = colourOf(t, by);
      chips[i].style.background = c || '';
      chips[i].classList.toggle('none', c === null);
    });
    legendSlot.replaceChildren(legend(by));
  };
  const choices = Object.entries(COLOURINGS).filter(([, c]) => c.needs(s)).map(([k, c]) =>
    el('label', {}, el('input', { type: 'radio', name: 'colour', value: k, checked: k === by, onchange: () => { by = k; paint(); } }), ' ' + c.label));
  const marked = s.tokens.filter((t) => t.marks && t.marks.length).length;
  view.replaceChildren(
    el('h1', {}, 'Sample ', el('span', { id: 'sample-seq' }, 'seq ' + s.seq)),
    el('div', { class: 'facts', id: 'sample-facts' },
      fact('session', el('a', { href: '#/session/' + encodeURIComponent(s.session_id), class: 'mono' }, s.session_id)),
      fact('turn', fmt(s.turn)), fact('mode', s.mode || '–'), fact('reward', fmt(s.reward)), fact('status', s.status),
      fact('trains', s.trains ? 'yes' : 'no' + (s.excluded ? ' (' + s.excluded + ')' : '')),
      s.votes !== undefined ? fact('votes', votes(s.votes)) : null,
      s.hint_votes !== undefined ? fact('hint votes', votes(s.hint_votes)) : null,
      s.hint ? fact('hint', el('span', { id: 'sample-hint' }, s.hint)) : null,
      s.teacher ? fact('teacher', s.teacher) : null,
      fact('prompt tokens', fmt(s.prompt_tokens)), fact('response tokens', fmt(s.response_tokens)),
      fact('marked positions', fmt(marked))),
    el('details', { id: 'prompt', open: s.images && s.images.length ? true : undefined },
      el('summary', {}, 'Prompt (' + fmt(s.prompt_tokens) + ' tokens' +
        (s.images && s.images.length ? ', ' + fmt(s.images.length) + ' image' + (s.images.length > 1 ? 's' : '') : '') + ')'),
      el('pre', {}, promptWithImages(s))),
    el('div', { class: 'controls' }, el('strong', {}, 'Colour by'), choices),
    legendSlot,
    box,
    el('details', {}, el('summary', {}, 'Metadata'), el('pre', {}, JSON.stringify(s.metadata, null, 2))));
  paint();
}

// The prompt text with each image where its template wrote it: the i-th <|image_pad|> becomes a
// thumbnail (its bytes fetched with the admin key) and one chip for the image's run of pad tokens.
const IMAGE_PAD = '<|image_pad|>';
function promptWithImages(s) {
  const images = s.images || [];
  if (!images.length) return s.prompt;
  const parts = s.prompt.split(IMAGE_PAD);
  const out = [parts[0]];
  for (let i = 1; i < parts.length; i++) {
    const image = images[i - 1];
    if (image) {
      const img = el('img', { class: 'thumb', alt: 'image ' + i + ' (' + image.width + 'x' + image.height + ')' });
      loadBlob(image.hash).then((url) => { img.src = url; }).catch(() => { img.alt += ': not kept'; });
      out.push(el('span', { class: 'image', title: image.mime + ', ' + image.width + 'x' + image.height + ', ' + image.hash },
        img, el('span', { class: 'chip image-chip' }, 'image ' + i + ' · ' + fmt(image.tokens) + ' tokens')));
    } else {
      out.push(IMAGE_PAD);
    }
    out.push(parts[i]);
  }
  return out;
}

async function loadBlob(hash) {
  const key = sessionStorage.getItem(KEY);
  const headers = {};
  if (key !== null) headers.Authorization = 'Bearer ' + key;
  const r = await fetch(new URL('../v1/rollout/blobs/' + encodeURIComponent(hash), location.href), { headers });
  if (!r.ok) throw new Error(r.status + ' ' + r.statusText);
  return URL.createObjectURL(await r.blob());
}

// ---- routing ----------------------------------------------------------------------------------

function schedule(id, ms) {
  clearTimeout(timer);
  timer = setTimeout(() => {
    if (id !== renderId) return;
    // Not while the tab is hidden, nor under someone typing a search.
    const typing = document.activeElement && document.activeElement.id === 'session-search';
    if (document.hidden || typing) schedule(id, ms);
    else render(true);
  }, ms);
}

async function render(refresh) {
  const id = ++renderId;
  clearTimeout(timer);
  if (!refresh) tip.hidden = true;
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  const parts = path.split('/');
  for (const a of document.querySelectorAll('[data-nav]')) {
    a.classList.toggle('active', a.dataset.nav === (parts[0] || 'overview') || (a.dataset.nav === 'sessions' && parts[0] === 'session'));
  }
  try {
    if (parts[0] === 'sessions') await sessions(id, params);
    else if (parts[0] === 'session' && parts[1] !== undefined) await timeline(id, decodeURIComponent(parts.slice(1).join('/')));
    else if (parts[0] === 'sample' && parts[1]) await sample(id, parts[1]);
    else await overview(id);
    if (id === renderId) setStatus('updated ' + new Date().toLocaleTimeString());
  } catch (e) {
    if (id !== renderId) return;
    setStatus(e.message, true);
    if (!refresh) view.replaceChildren(el('h1', {}, 'Not available'), el('p', { class: 'error', id: 'error' }, e.message));
    if (!refresh || e.status === undefined) schedule(id, 5000);
  }
}

document.getElementById('seq-form').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const v = document.getElementById('seq-input').value;
  if (v) location.hash = '#/sample/' + encodeURIComponent(v);
});
document.addEventListener('keydown', (ev) => { if (ev.key === 'Escape') tip.hidden = true; });
window.addEventListener('hashchange', () => render(false));
render(false);

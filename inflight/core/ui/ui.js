// The live page: polls the state every second and draws every zone. Data
// only ever reaches the page as text (textContent, text nodes, attribute
// values): keys may be anything a client sent.
'use strict';
(() => {
  const POLL_MS = 1000;
  const WINDOW_MS = 5 * 60 * 1000; // what the charts show
  const REASONS = ['full', 'timeout', 'queue_full', 'keys_full', 'store_error', 'dry_run'];
  const SVG = 'http://www.w3.org/2000/svg';
  // Beside this script, wherever the page is mounted, without the
  // credentials of a page opened as http://user:pass@host/ (fetch refuses
  // a URL with credentials; the browser sends the ones it keeps).
  const stateURL = new URL('state', document.currentScript.src);
  stateURL.username = stateURL.password = '';
  const zonesEl = document.getElementById('zones');
  const statusEl = document.getElementById('status');
  const seen = new Map(); // zone id -> {points, last}

  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  function td(value, field, cls) {
    const c = el('td', cls || (value === 0 ? 'zero' : ''), value);
    if (field) c.dataset.field = field;
    return c;
  }

  function row(cells) { return el('tr', '', ...cells); }

  function table(head, rows, empty) {
    if (rows.length === 0 && empty) return el('div', 'empty', empty);
    return el('table', '', el('thead', '', row(head.map((h) => el('th', '', h)))), el('tbody', '', ...rows));
  }

  // bar shows used against cap (for a limit: its busiest key's slots
  // against the max per key).
  function bar(used, cap, what) {
    const b = el('span', 'bar', el('i'));
    if (!cap) return b;
    const f = Math.min(1, used / cap);
    b.firstChild.style.width = (f * 100).toFixed(1) + '%';
    if (f >= 1) b.classList.add('full'); else if (f >= 0.8) b.classList.add('high');
    b.title = (what ? what + ': ' : '') + used + ' / ' + cap;
    return b;
  }

  function ms(seconds) {
    if (!seconds) return '0';
    return seconds < 1 ? (seconds * 1000).toFixed(seconds < 0.01 ? 1 : 0) + ' ms' : seconds.toFixed(2) + ' s';
  }

  function rate(r) { return r === 0 ? 0 : r < 10 ? r.toFixed(1) : Math.round(r); }

  // inFlight is what the zone has in flight, requests and the units they
  // hold: the total's, or else the busiest limit's (a request holds its
  // units in every limit).
  function inFlight(z) {
    if (z.total !== undefined) return { requests: z.total, units: z.total_units };
    return {
      requests: z.limits.reduce((m, l) => Math.max(m, l.held), 0),
      units: z.limits.reduce((m, l) => Math.max(m, l.units), 0),
    };
  }

  function sumRefused(refused) {
    const out = {};
    for (const r of REASONS) out[r] = (refused && refused[r]) || 0;
    return out;
  }

  // track adds this poll to the zone's history and returns the refusal
  // rates by reason since the previous poll.
  function track(id, z, now) {
    let h = seen.get(id);
    const refused = sumRefused(z.refused);
    const rates = {};
    let all = 0;
    for (const r of REASONS) {
      const d = h ? (refused[r] - h.last.refused[r]) / Math.max(0.001, (now - h.last.t) / 1000) : 0;
      rates[r] = Math.max(0, d);
      all += rates[r];
    }
    if (!h) { h = { points: [] }; seen.set(id, h); }
    h.last = { t: now, refused };
    const f = inFlight(z);
    h.points.push({ t: now, inflight: f.requests, units: f.units, cap: z.total_max || 0, waiting: z.waiting, refused: all });
    while (h.points.length && h.points[0].t < now - WINDOW_MS) h.points.shift();
    return { rates, all, points: h.points };
  }

  // path draws a field's history, the oldest point at the left edge (the
  // charts span at most WINDOW_MS).
  function path(points, field, now, top) {
    const span = Math.max(1000, now - (points.length ? points[0].t : now));
    let d = '';
    for (const p of points) {
      const x = 240 * (1 - (now - p.t) / span);
      const y = 42 - 40 * (p[field] / top);
      d += (d ? ' L' : 'M') + x.toFixed(1) + ',' + y.toFixed(1);
    }
    return d || 'M0,42';
  }

  function chart(title, points, now, fields) {
    let top = 1;
    for (const p of points) for (const f of fields) top = Math.max(top, p[f]);
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('class', 'chart');
    svg.setAttribute('viewBox', '0 0 240 44');
    svg.setAttribute('preserveAspectRatio', 'none');
    for (const f of fields) {
      const p = document.createElementNS(SVG, 'path');
      p.setAttribute('class', f);
      p.setAttribute('d', path(points, f, now, top));
      svg.append(p);
    }
    const last = points.length ? points[points.length - 1][fields[0]] : 0;
    const fmt = fields[0] === 'refused' ? rate : (n) => n;
    return el('figure', '', el('figcaption', '', el('span', '', title), el('span', '', 'now ' + fmt(last) + ' · max ' + fmt(top))), svg);
  }

  // weighed tells whether the zone's requests have costs (the state has
  // `cost` then) or hold more than one unit: only then are units shown
  // beside the requests, and charted against the caps, which are in units
  // (caps, fills and the busiest keys are in units either way).
  function weighed(z) {
    return z.cost !== undefined || z.waiting_units !== z.waiting || (z.total_units !== undefined && z.total_units !== z.total) ||
      z.limits.some((l) => l.units !== l.held);
  }

  function capsTable(z) {
    const units = weighed(z);
    const busiest = {};
    for (const k of z.top_keys) busiest[k.limit] = Math.max(busiest[k.limit] || 0, k.held);
    const rows = z.limits.map((l) => row([
      td(l.name), td(l.held, 'held-' + l.name), ...(units ? [td(l.units, 'units-' + l.name)] : []), td(l.max ? l.max + ' /key' : 'per request'),
      el('td', '', bar(busiest[l.name] || 0, l.max, 'busiest key')), td(l.keys, 'keys-' + l.name),
    ]));
    if (z.total !== undefined) {
      const used = z.total_units !== undefined ? z.total_units : z.total;
      rows.push(row([td('total'), td(z.total, 'held-total'), ...(units ? [td(used, 'units-total')] : []), td(z.total_max || '—'), el('td', '', bar(used, z.total_max)), td('')]));
    }
    return table(['cap', 'in flight', ...(units ? ['units'] : []), 'max', 'fill', 'keys'], rows);
  }

  function queueTable(z) {
    const w = z.wait || { count: 0, p50: 0, p90: 0, p99: 0 };
    const units = weighed(z);
    const c = z.cost || { count: 0, sum: 0 };
    return table(['waiting', ...(units ? ['units', 'mean cost'] : []), 'p50', 'p90', 'p99', 'waits (1–2 min)'],
      [row([td(z.waiting, 'waiting', z.waiting > 0 ? 'hot' : ''),
        ...(units ? [td(z.waiting_units, 'waiting-units'), td(c.count ? Math.round(c.sum / c.count) : 0, 'mean-cost')] : []),
        td(ms(w.p50), 'p50'), td(ms(w.p90), 'p90'), td(ms(w.p99), 'p99'), td(w.count, 'waits')])]);
  }

  function refusedTable(z, rates) {
    const totals = sumRefused(z.refused);
    const head = ['refused', ...REASONS];
    return table(head, [
      row([td('per second'), ...REASONS.map((r) => td(rate(rates[r]), 'rate-' + r, rates[r] > 0 ? 'hot' : ''))]),
      row([td('since start'), ...REASONS.map((r) => td(totals[r], 'refused-' + r))]),
    ]);
  }

  // usageTable shows how far the zone's token estimates were from the
  // usage models reported (below 1: room held back; above: the backend
  // held more than was reserved), and the output estimate with
  // default_output auto.
  function usageTable(u) {
    const ratio = u.estimated_tokens ? (u.reported_tokens / u.estimated_tokens).toFixed(2) : '—';
    const over = u.reports ? (100 * u.over_estimate / u.reports).toFixed(1) + ' %' : '—';
    const est = u.output_estimate ? u.output_estimate + (u.learned ? ' (learned)' : ' (default)') : '—';
    return table(['reports', 'reported ÷ estimated', 'over estimate', 'output estimate'],
      [row([td(u.reports, 'usage-reports'), td(ratio, 'usage-ratio'), td(over, 'usage-over'), td(est, 'output-estimate')])]);
  }

  // modelsTable shows the output estimate of each model with 20 reports
  // or more: its own once learnt, else the zone's, which it counts.
  function modelsTable(models) {
    return table(['model', 'reports', 'output estimate'], models.map((m) => {
      const name = td(m.model, 'model-name', 'key');
      name.title = m.model;
      return row([name, td(m.reports, 'model-reports'), td(m.output_estimate + (m.learned ? ' (learned)' : ' (zone)'), 'model-estimate')]);
    }));
  }

  function adaptiveTable(a) {
    return table(['adaptive limit', 'baseline', 'latest sample'],
      [row([td(a.limit, 'adaptive-limit'), td(ms(a.baseline_seconds), 'adaptive-baseline'), td(ms(a.sample_seconds))])]);
  }

  // keysTable lists keys; keys that waited (with metrics per_key) add the
  // p50 and p99 of their recent waits, and their share of the slot-seconds
  // their limit gave in the last 1–2 minutes, beside their weight.
  function keysTable(keys, field, head) {
    const waits = keys.some((k) => k.wait);
    const shares = keys.some((k) => k.share !== undefined);
    const cols = ['limit', head, field].concat(waits ? ['wait p50', 'wait p99'] : [], shares ? ['share (1–2 min)', 'weight'] : []);
    return table(cols, keys.map((k) => {
      const key = td(k.key, '', 'key');
      key.title = k.key;
      const cells = [td(k.limit), key, td(k[field])];
      if (waits) cells.push(td(k.wait ? ms(k.wait.p50) : '—', 'key-p50'), td(k.wait ? ms(k.wait.p99) : '—', 'key-p99'));
      if (shares) cells.push(td(k.share !== undefined ? (100 * k.share).toFixed(1) + ' %' : '—', 'key-share'), td(k.weight || '—', 'key-weight'));
      return row(cells);
    }), 'none');
  }

  function zoneSection(id, z, now) {
    const t = track(id, z, now);
    const title = el('h2', '', el('span', '', z.zone));
    if (z.retired) title.append(el('span', 'badge', 'retired'));
    if (z.store) {
      const ok = z.store.reachable;
      const b = el('span', 'badge ' + (ok ? 'ok' : 'bad'), 'store ' + z.store.type + ': ' + (ok ? 'reachable' : 'unreachable'));
      b.dataset.field = 'store';
      title.append(b);
    }
    if (z.adaptive) title.append(el('span', 'badge', 'adaptive total'));
    const left = el('div', '', el('h3', '', 'Slots'), capsTable(z), el('h3', '', 'Queue'), queueTable(z), el('h3', '', 'Refusals'), refusedTable(z, t.rates));
    if (z.usage) left.append(el('h3', '', 'Tokens reported'), usageTable(z.usage));
    if (z.usage && z.usage.models) left.append(el('h3', '', 'Output estimate per model'), modelsTable(z.usage.models));
    if (z.adaptive) left.append(el('h3', '', 'Adaptive total'), adaptiveTable(z.adaptive));
    const span = Math.round((now - t.points[0].t) / 1000);
    // In units where requests have costs, as the cap is.
    const held = weighed(z) ? 'units' : 'inflight';
    const charts = el('div', '', el('h3', '', span < 300 ? 'Last ' + span + ' s' : 'Last 5 minutes'), el('div', 'charts',
      chart((held === 'units' ? 'units in flight' : 'in flight') + (z.total_max ? ' (cap dashed)' : ''), t.points, now, z.total_max ? [held, 'cap'] : [held]),
      chart('waiting', t.points, now, ['waiting']),
      chart('refused /s', t.points, now, ['refused'])));
    const keys = el('div', 'keys', el('h3', '', 'Holding most'), keysTable(z.top_keys, 'held', 'key'),
      el('h3', '', 'Waiting most'), keysTable(z.top_waiting, 'waiting', 'key'));
    const s = el('section', 'zone', title, el('div', 'grid', left, charts, keys));
    s.dataset.zone = z.zone;
    return s;
  }

  function render(state, now) {
    const sections = [];
    const live = new Set();
    for (const z of state.zones) {
      const id = z.zone + (z.retired ? '\u0000retired' : '');
      live.add(id);
      sections.push(zoneSection(id, z, now));
    }
    for (const id of seen.keys()) if (!live.has(id)) seen.delete(id);
    zonesEl.replaceChildren(...(sections.length ? sections : [el('div', 'empty', 'No zone is in use.')]));
  }

  async function poll() {
    try {
      // A request that hangs must not stop the page: it gives up in time
      // for the next one.
      const resp = await fetch(stateURL, { cache: 'no-store', credentials: 'same-origin', signal: AbortSignal.timeout(5 * POLL_MS) });
      if (!resp.ok) throw new Error('HTTP ' + resp.status);
      const state = await resp.json();
      const now = Date.now();
      render(state, now);
      statusEl.className = 'status';
      statusEl.textContent = 'updated ' + new Date(now).toLocaleTimeString() + ' · every ' + POLL_MS / 1000 + ' s · ' + state.zones.length + ' zone' + (state.zones.length === 1 ? '' : 's');
    } catch (err) {
      statusEl.className = 'status err';
      statusEl.textContent = 'cannot read the state: ' + err.message;
    }
    setTimeout(poll, POLL_MS);
  }

  poll();
})();

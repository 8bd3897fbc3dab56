// muster live dashboard: follows the cluster event feed over a WebSocket and
// refreshes the page's live parts from GET /api/v1/live (the node's cached,
// reconciled view). No build step, no CDN; without JavaScript the pages are
// plain server-rendered HTML.
//
// A page opts in with <body data-live-page="..." data-live-topics="...">:
//   [data-live="path"]             text set from the snapshot (e.g. nodes_alive)
//   [data-live-sum="field"]        sum of that field over all queues
//   tr[data-live-queue="name"] [data-field="queued"]   per-queue counts
//   tbody#live-nodes               node states (rows added, updated, removed)
//   svg#throughput                 tasks per second, last ten minutes (the
//                                  fallback of charts.js's uPlot chart)
//   [data-chart][id]               charts.js's charts: kept across swaps
//   tbody#live-events              the Events page: new events on top
//   data-live-swap="main"          on <body>: the page itself is fetched again
//                                  on each event and its <main> swapped in
//                                  place (no reload), unless the user is in
//                                  the middle of a form there (a field
//                                  focused or a box ticked): then next time
//   data-live-subject="task=ID"    on <body>: only events about that subject
//                                  (a task, a workflow, a schedule) count
//   [data-countdown="ms"]          time left until that Redis ms, ticking
//                                  every second, counted from the page's
//                                  Redis time (body data-now), not the
//                                  browser's clock
(function () {
  'use strict';
  var body = document.body;
  var page = body.dataset.livePage;
  if (!page || !('WebSocket' in window)) return;
  var last = body.dataset.liveSince || null;
  var timer = null;
  var backoff = 500;
  var status = document.getElementById('live-status');
  var swap = body.dataset.liveSwap;
  var subject = (body.dataset.liveSubject || '').split('=');
  // Redis time minus browser time when the page was rendered.
  var skew = Number(body.dataset.now || Date.now()) - Date.now();

  function setStatus(text, on) {
    if (!status) return;
    status.textContent = text;
    status.className = on ? 'live on' : 'live off';
  }

  function get(obj, path) {
    return path.split('.').reduce(function (o, k) { return o == null ? undefined : o[k]; }, obj);
  }

  function text(el, v) {
    var s = String(v);
    if (el.textContent !== s) el.textContent = s;
  }

  function render(s) {
    document.querySelectorAll('[data-live]').forEach(function (el) {
      var v = get(s, el.dataset.live);
      if (v !== undefined && v !== null) text(el, v);
    });
    document.querySelectorAll('[data-live-sum]').forEach(function (el) {
      var f = el.dataset.liveSum, n = 0;
      Object.keys(s.queues || {}).forEach(function (q) { n += s.queues[q][f] || 0; });
      text(el, n);
    });
    document.querySelectorAll('tr[data-live-queue]').forEach(function (row) {
      var q = (s.queues || {})[row.dataset.liveQueue];
      if (!q) return;
      row.querySelectorAll('[data-field]').forEach(function (c) {
        var v = q[c.dataset.field];
        if (v !== undefined) text(c, v);
      });
    });
    var nodes = document.getElementById('live-nodes');
    if (nodes) renderNodes(nodes, s.nodes || {});
    drawChart(document.getElementById('throughput'), s.throughput || []);
  }

  function renderNodes(tbody, nodes) {
    var seen = {};
    tbody.querySelectorAll('tr[data-node]').forEach(function (row) {
      var n = nodes[row.dataset.node];
      if (!n) { row.remove(); return; }
      seen[n.id] = true;
      var pill = row.querySelector('[data-field="state"]');
      if (pill) { text(pill, n.state); pill.className = 'pill ' + n.state; }
    });
    Object.keys(nodes).forEach(function (id) {
      if (seen[id]) return;
      var n = nodes[id];
      var row = document.createElement('tr');
      row.dataset.node = id;
      var c1 = document.createElement('td');
      var code = document.createElement('code');
      code.textContent = id;
      c1.appendChild(code);
      var c2 = document.createElement('td');
      c2.textContent = n.kind;
      var c3 = document.createElement('td');
      var pill = document.createElement('span');
      pill.dataset.field = 'state';
      pill.className = 'pill ' + n.state;
      pill.textContent = n.state;
      c3.appendChild(pill);
      row.appendChild(c1); row.appendChild(c2); row.appendChild(c3);
      tbody.appendChild(row);
    });
  }

  // The throughput's figures, and its plain SVG line until charts.js draws
  // the chart (or for good, without uPlot).
  function drawChart(svg, series) {
    if (!series.length) return;
    var max = 0;
    series.forEach(function (v) { if (v > max) max = v; });
    var maxEl = document.getElementById('throughput-max');
    if (maxEl) text(maxEl, max);
    var label = document.getElementById('throughput-now');
    if (label) {
      var recent = series.slice(-10), sum = 0;
      recent.forEach(function (v) { sum += v; });
      text(label, (sum / recent.length).toFixed(1));
    }
    var line = svg && svg.querySelector('polyline');
    if (!line) return;
    var scale = Math.max(max, 1), w = 600, h = 100, pts = [];
    series.forEach(function (v, i) {
      pts.push((i * w / (series.length - 1)).toFixed(1) + ',' + (h - v * h / scale).toFixed(1));
    });
    line.setAttribute('points', pts.join(' '));
  }

  function human(ms) {
    var s = Math.ceil(ms / 1000);
    if (s < 60) return s + ' s';
    var m = Math.floor(s / 60);
    if (m < 60) return m + ' min ' + (s % 60) + ' s';
    return Math.floor(m / 60) + ' h ' + (m % 60) + ' min';
  }

  function tick() {
    var now = Date.now() + skew;
    document.querySelectorAll('[data-countdown]').forEach(function (el) {
      var left = Number(el.dataset.countdown) - now;
      text(el, left > 0 ? '(in ' + human(left) + ')' : '(passed)');
    });
  }
  tick();
  setInterval(tick, 1000);

  // Fetches this page again and swaps its <main> in place: the same HTML the
  // server renders without JavaScript, so the two can never disagree.
  function swapMain() {
    fetch(location.href, { credentials: 'same-origin', headers: { accept: 'text/html' } })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var doc = new DOMParser().parseFromString(html, 'text/html');
        var fresh = doc.querySelector('main'), main = document.querySelector('main');
        if (!fresh || !main) return;
        // Never under the user's hands: a focused field or a ticked box
        // (a confirmation) would be lost; the next event or tick retries.
        var active = document.activeElement;
        if ((active && active !== body && main.contains(active) && active.matches('input, select, textarea'))
            || main.querySelector('input[type=checkbox]:checked')) return;
        // Charts stay: their elements move into the fresh <main> (charts.js
        // gives a plot new data instead of drawing it again).
        var charts = {};
        main.querySelectorAll('[data-chart][id]').forEach(function (el) { charts[el.id] = el; });
        if (fresh.innerHTML !== main.innerHTML) {
          main.innerHTML = fresh.innerHTML;
          main.querySelectorAll('[data-chart][id]').forEach(function (el) {
            if (charts[el.id]) el.replaceWith(charts[el.id]);
          });
        }
        if (doc.body && doc.body.dataset.now) skew = Number(doc.body.dataset.now) - Date.now();
        tick();
      })
      .catch(function () {});
  }

  function refresh() {
    timer = null;
    if (swap) { swapMain(); return; }
    fetch('/api/v1/live', { credentials: 'same-origin', headers: { accept: 'application/json' } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) render(s); })
      .catch(function () {});
  }

  function schedule() {
    if (!timer) timer = setTimeout(refresh, 150);
  }

  // The node reconciles its view from Redis periodically; re-read it now and
  // then too, so a correction shows even when no event follows it.
  setInterval(schedule, 3000);

  function appendEvent(ev) {
    var tbody = document.getElementById('live-events');
    if (!tbody) return;
    var row = document.createElement('tr');
    var subjects = [];
    Object.keys(ev).forEach(function (k) {
      if (['id', 'type', 'ts', 'node', 'data'].indexOf(k) < 0) subjects.push(k + '=' + ev[k]);
    });
    [new Date(ev.ts).toISOString().replace('T', ' '), ev.type, ev.node, subjects.join(' '),
      JSON.stringify(ev.data)].forEach(function (v, i) {
      var td = document.createElement('td');
      if (i === 1) {
        var pill = document.createElement('span');
        pill.className = 'pill';
        pill.textContent = v;
        td.appendChild(pill);
      } else {
        td.textContent = v;
      }
      row.appendChild(td);
    });
    tbody.insertBefore(row, tbody.firstChild);
    while (tbody.children.length > 500) tbody.removeChild(tbody.lastChild);
  }

  function connect() {
    var params = new URLSearchParams();
    params.set('topics', body.dataset.liveTopics || '*');
    if (body.dataset.liveQueue) params.set('queue', body.dataset.liveQueue);
    if (last) params.set('since', last);
    var proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    var ws = new WebSocket(proto + '//' + location.host + '/api/v1/events/ws?' + params.toString());
    ws.onopen = function () { backoff = 500; setStatus('live', true); schedule(); };
    ws.onmessage = function (m) {
      var ev;
      try { ev = JSON.parse(m.data); } catch (e) { return; }
      if (ev.type === 'lagged') { if (ev.last_id) last = ev.last_id; return; }
      if (ev.type === 'gap') { schedule(); return; }
      if (ev.id) last = ev.id;
      if (page === 'events') appendEvent(ev);
      if (subject.length === 2 && ev[subject[0]] !== subject[1]) return;
      schedule();
    };
    ws.onclose = function () {
      setStatus('reconnecting', false);
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 10000);
    };
  }

  connect();
})();

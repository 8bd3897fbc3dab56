// muster charts: the dashboard's charts, drawn with uPlot (vendored under
// static/vendor/uplot from its package's dist/, MIT). No build step, no CDN.
// Without JavaScript a chart's card still shows its totals as text.
//
// A chart is an element <div class="chart" id="..." data-chart="KIND"> with
//   data-range="hour|month"  (rates, depth) the span, from GET /api/v1/stats
//   data-queue="name"        one queue's numbers (all queues without it)
// KIND is one of
//   live    succeeded, failed attempts and dead letters per second over the
//           last ten minutes, from GET /api/v1/live (this node's view), every 2 s
//   rates   the same from the history in Redis: per second (the minute's
//           average) over the last hour, every 5 s; per day over 30 days
//   depth   queued tasks (left axis) and queue latency (right axis, seconds):
//           the peak of each minute over the last hour, or of each day over 30
// Each chart writes its span's totals into the [data-total="succeeded|failed|
// dead"] elements of its card. A page that swaps its <main> in place keeps
// its chart elements (live.js moves them into the fresh <main>), so a plot is
// drawn once and then only given new data.
(function () {
  'use strict';
  if (!window.uPlot) return;
  var COLORS = { succeeded: '#1f8a4c', failed: '#b7791f', dead: '#c0392b', queued: '#2f5bd3', latency: '#7a4cc2' };
  var EVERY = { live: 2000, hour: 5000, month: 60000 };

  function getJson(url) {
    return fetch(url, { credentials: 'same-origin', headers: { accept: 'application/json' } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .catch(function () { return null; });
  }

  function fixed(v) { return v == null ? '' : (Math.round(v * 100) / 100).toString(); }

  function line(label, color, unit, scale) {
    return {
      label: label, stroke: color, width: 1.5, scale: scale || 'y',
      value: function (u, v) { return v == null ? '' : fixed(v) + ' ' + unit; },
    };
  }

  function sum(a) { var n = 0; (a || []).forEach(function (v) { n += v; }); return n; }

  function setTotals(el, totals) {
    var card = el.closest('.card') || document;
    Object.keys(totals).forEach(function (k) {
      card.querySelectorAll('[data-total="' + k + '"]').forEach(function (t) {
        var v = String(Math.round(totals[k]));
        if (t.textContent !== v) t.textContent = v;
      });
    });
  }

  // The options of a chart of `kind`; `unit` labels its y axis.
  function options(el, kind, unit) {
    var series = [{ label: 'time' }];
    var axes = [{}];
    if (kind === 'depth') {
      series.push(line('queued', COLORS.queued, 'tasks'));
      series.push(line('latency', COLORS.latency, 's', 's'));
      axes.push({ label: 'queued tasks', scale: 'y' });
      axes.push({ label: 'latency, s', scale: 's', side: 1, grid: { show: false } });
    } else {
      series.push(line('succeeded', COLORS.succeeded, unit));
      series.push(line('failed', COLORS.failed, unit));
      series.push(line('dead', COLORS.dead, unit));
      axes.push({ label: unit });
    }
    return {
      width: Math.max(el.clientWidth || 600, 300),
      height: 180,
      series: series,
      axes: axes,
      scales: { x: { time: true }, y: { range: function (u, min, max) { return [0, Math.max(max, 1)]; } },
        s: { range: function (u, min, max) { return [0, Math.max(max, 1)]; } } },
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
    };
  }

  function draw(el, kind, unit, data) {
    var plot = el._plot;
    if (!plot || el._unit !== unit) {
      if (plot) plot.destroy();
      el.textContent = '';
      el._plot = new window.uPlot(options(el, kind, unit), data, el);
      el._unit = unit;
    } else {
      plot.setData(data);
    }
    el.dataset.drawn = String(Date.now());
  }

  function liveData(s) {
    var n = (s.throughput || []).length;
    var end = s.throughput_end || 0, t = [], ok = [], failed = [], dead = [];
    for (var i = 0; i < n; i++) {
      var d = (s.dead_per_second || [])[i] || 0;
      t.push(end - n + 1 + i);
      ok.push(Math.max(s.throughput[i] - d, 0));
      failed.push((s.failed_per_second || [])[i] || 0);
      dead.push(d);
    }
    return [t, ok, failed, dead];
  }

  function update(el) {
    var kind = el.dataset.chart;
    if (kind === 'live') {
      return getJson('/api/v1/live').then(function (s) {
        if (!s) return;
        var data = liveData(s);
        draw(el, kind, 'tasks/s', data);
        setTotals(el, { succeeded: sum(data[1]), failed: sum(data[2]), dead: sum(data[3]) });
      });
    }
    var params = new URLSearchParams();
    params.set('range', el.dataset.range || 'hour');
    if (el.dataset.queue) params.set('queue', el.dataset.queue);
    return getJson('/api/v1/stats?' + params.toString()).then(function (st) {
      if (!st) return;
      if (kind === 'depth') {
        draw(el, kind, '', [st.t, st.queued, st.latency_ms.map(function (v) { return v / 1000; })]);
        return;
      }
      var perSecond = st.step_s === 60;
      var per = function (a) { return a.map(function (v) { return perSecond ? v / 60 : v; }); };
      draw(el, kind, perSecond ? 'tasks/s' : 'tasks/day', [st.t, per(st.succeeded), per(st.failed), per(st.dead)]);
      setTotals(el, { succeeded: sum(st.succeeded), failed: sum(st.failed), dead: sum(st.dead) });
    });
  }

  // Each chart refreshes on its own timer while the page is visible; the
  // element is looked up by id every time, since a swapped <main> may hold
  // it anew.
  function follow(id, every) {
    var busy = false;
    function run() {
      var el = document.getElementById(id);
      if (!el || busy || document.hidden) return;
      busy = true;
      update(el).then(function () { busy = false; }, function () { busy = false; });
    }
    run();
    setInterval(run, every);
  }

  document.querySelectorAll('[data-chart][id]').forEach(function (el) {
    var every = el.dataset.chart === 'live' ? EVERY.live : EVERY[el.dataset.range || 'hour'] || EVERY.hour;
    follow(el.id, every);
  });

  window.addEventListener('resize', function () {
    document.querySelectorAll('[data-chart]').forEach(function (el) {
      if (el._plot) el._plot.setSize({ width: Math.max(el.clientWidth, 300), height: 180 });
    });
  });
})();

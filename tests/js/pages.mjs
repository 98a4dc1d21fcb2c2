// The pages the browser test and the demo load: analytics.js (@segment/analytics-next's own
// browser bundle, from node_modules) pointed at the tracking API with only `cdnURL` changed; the
// settings document the API serves points the library's `apiHost` back at it.
//
// GET /analytics-next.js   the library's UMD bundle (global `AnalyticsNext`)
// GET /<name>.html?key=WRITE_KEY&api=BASE_URL&strategy=standard|batching[&beacon=URL]
//                          a page that loads the library and exposes `window.ajs` (the analytics
//                          object) and `window.ready` (resolves once it has loaded its settings);
//                          with `beacon`, it posts that body with navigator.sendBeacon when the
//                          page is left
// GET /demo.html?...       the same, with buttons that send events, for a person to click

import fs from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(import.meta.url);
const bundle = path.join(path.dirname(require.resolve('@segment/analytics-next/package.json')), 'dist/umd/index.js');

const loader = `
<script src="/analytics-next.js"></script>
<script>
  const q = new URLSearchParams(location.search);
  const api = q.get('api');
  const deliveryStrategy = q.get('strategy') === 'batching'
    ? { strategy: 'batching', config: { size: 10, timeout: 60000 } }
    : { strategy: 'standard', config: {} };
  // Only the CDN is changed: the settings document from the API sets apiHost and protocol.
  window.ajs = AnalyticsNext.AnalyticsBrowser.load(
    { writeKey: q.get('key'), cdnURL: api },
    { integrations: { 'Segment.io': { deliveryStrategy } } },
  );
  window.ready = window.ajs.then(() => true);
  const beacon = q.get('beacon');
  if (beacon) {
    addEventListener('pagehide', () => {
      window.beaconQueued = navigator.sendBeacon(api + '/v1/t', beacon);
    });
  }
</script>`;

const testPage = `<!doctype html><html><head><meta charset="utf-8"><title>dedupe test page</title>${loader}</head>
<body><p>dedupe: a page that sends events with analytics.js</p></body></html>`;

const demoPage = `<!doctype html><html><head><meta charset="utf-8"><title>dedupe: analytics.js demo</title>${loader}
<style>body{font-family:sans-serif;margin:2em;max-width:40em} button{font-size:1.1em;margin:.3em} #log{font-family:monospace;white-space:pre}</style>
</head><body>
<h1>dedupe: analytics.js demo</h1>
<p>Each button sends an event with Segment's own browser library to the local tracking API, which
logs it to Kafka; the worker removes duplicates. Reload the page while events are in flight: the
library sends them again with the same messageId, and only one copy reaches the output topic.</p>
<button onclick="ajs.track('Button Clicked', { button: 'buy' })">track</button>
<button onclick="ajs.page('Demo')">page</button>
<button onclick="ajs.identify('demo-user', { plan: 'pro' })">identify</button>
<button onclick="for (let i = 0; i < 20; i++) ajs.track('Burst', { i })">20 tracks</button>
<div id="log"></div>
<script>
  ajs.on('track', (e, p) => { document.getElementById('log').textContent += 'track ' + e + '\\n'; });
  window.ready.then(() => { document.getElementById('log').textContent += 'analytics.js loaded its settings from ' + api + '\\n'; });
</script>
</body></html>`;

/** Serves the pages on host:port; resolves to the server once it listens. */
export function startPageServer({ host = '127.0.0.1', port = 0 } = {}) {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://page');
    if (url.pathname === '/analytics-next.js') {
      res.writeHead(200, { 'content-type': 'text/javascript' });
      fs.createReadStream(bundle).pipe(res);
    } else if (url.pathname === '/demo.html') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      res.end(demoPage);
    } else if (url.pathname.endsWith('.html')) {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      res.end(testPage);
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' });
      res.end('not found');
    }
  });
  return new Promise((resolve, reject) => {
    server.on('error', reject);
    server.listen(port, host, () => resolve(server));
  });
}

// Segment's browser library (@segment/analytics-next) in a real headless Chromium against
// `dedupe ingest`, run by tests/ingest.rs, which checks what it prints and what reached Kafka.
//
// The page is served from http://localhost:PAGE_PORT and the API is reached at
// http://127.0.0.1:<proxy>: another origin, so every request with the library's Authorization
// header is preflighted and CORS is real. The proxy holds each answer HOLD_MS, and the page is
// navigated away while events are in flight, in each delivery strategy:
// - standard: one request per event to /v1/t, /v1/i, ...; the events in flight when the page is
//   left are kept in localStorage and sent again by the next page, with the same messageIds;
// - batching: batches to /v1/b; the batch still buffered when the page is left goes out as a
//   keepalive request that outlives the page.
// The page also posts one event with navigator.sendBeacon as it is left.
//
// With SCENARIO=invalid-event, one scenario instead: ten events of the batching strategy, one
// batch to /v1/b, in which a source middleware removes the `event` name of one track (the
// library checks the name when it makes the event, before its middleware runs). The tracking API
// dead-letters that one and takes the other nine; the page stays.
//
// Environment: INGEST_URL, WRITE_KEY, PAGE_PORT, RUN_ID; CHROMIUM (default /usr/bin/chromium),
// HOLD_MS (default 1500), SCENARIO (default: both strategies). Prints one JSON line:
// { scenarios: [{ name, expected, leftAt, requests }], console } (for invalid-event, each scenario
// has `invalid`, the messageId of the invalid event, instead of `leftAt`), times in Unix
// milliseconds.

import puppeteer from 'puppeteer-core';
import { env, startProxy, waitFor } from './proxy.mjs';
import { startPageServer } from './pages.mjs';

const ingest = env('INGEST_URL');
const writeKey = env('WRITE_KEY');
const pagePort = Number(env('PAGE_PORT'));
const run = env('RUN_ID');
const holdMs = Number(process.env.HOLD_MS ?? 1500);
const chromium = process.env.CHROMIUM ?? '/usr/bin/chromium';
const only = process.env.SCENARIO;
if (only !== undefined && only !== 'invalid-event') throw new Error(`unknown SCENARIO ${only}`);

const pages = await startPageServer({ host: '127.0.0.1', port: pagePort });
const origin = `http://localhost:${pagePort}`;
// The port the ingest's public URL names (its settings document points the library there).
const proxy = await startProxy({ upstream: ingest, holdMs, port: Number(env('PROXY_PORT')) });
const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
});
const consoleLines = [];

/** Ids the ingest has answered 200 for, from the proxy's log. */
function accepted() {
  return new Set(proxy.log.filter((r) => r.status === 200).flatMap((r) => r.ids));
}

async function scenario(strategy) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.on('console', (m) => consoleLines.push(`${strategy}: ${m.type()}: ${m.text()}`));
  page.on('requestfailed', (r) => consoleLines.push(`${strategy}: request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  const id = (n) => `${run}-${strategy}-${n}`;
  const beacon = JSON.stringify({ writeKey, type: 'track', event: 'Page Left', anonymousId: `anon-${run}`, messageId: id('beacon') });
  const query = (extra) =>
    `key=${encodeURIComponent(writeKey)}&api=${encodeURIComponent(proxy.url)}&strategy=${strategy}${extra}`;
  const logStart = proxy.log.length;

  await page.goto(`${origin}/send.html?${query(`&beacon=${encodeURIComponent(beacon)}`)}`);
  await page.evaluate(() => window.ready);

  // Events of every type the browser library sends; in the batching strategy the first ten fill
  // a batch, which goes out at once, and the rest wait in the buffer.
  const first = strategy === 'batching' ? 10 : 6;
  const ids = Array.from({ length: first + 3 }, (_, i) => id(i));
  await page.evaluate((ids) => {
    const o = (i) => ({ messageId: ids[i] });
    ajs.identify('user-1', { plan: 'pro' }, o(0));
    ajs.page('Shop', 'Home', { path: '/home' }, o(1));
    ajs.group('group-1', { name: 'Team' }, o(2));
    ajs.alias('user-1', 'anon-1', o(3));
    for (let i = 4; i < ids.length; i++) ajs.track('Clicked', { i }, o(i));
  }, ids);

  // Once the ingest has taken the first events (their answers held by the proxy), leave the page.
  await waitFor(`the ingest to accept ${strategy}'s first ${first} events`, () => ids.slice(0, first).every((i) => accepted().has(i)), 20_000);
  const leftAt = Date.now();
  await page.goto(`${origin}/land.html?${query('')}`);
  await page.evaluate(() => window.ready);
  await page.evaluate((landed) => ajs.track('Landed', {}, { messageId: landed }), id('landed'));
  if (strategy === 'batching') {
    // The batch is not full: leaving this page too sends it, as a keepalive request.
    await page.goto('about:blank');
  }

  const expected = [...ids, id('beacon'), id('landed')];
  await waitFor(`every ${strategy} event to be accepted`, () => expected.every((i) => accepted().has(i)), 30_000);
  // Let answers held for the navigated page be counted as lost before the log is read.
  await new Promise((r) => setTimeout(r, holdMs + 200));
  await context.close();
  return { name: strategy, expected, leftAt, requests: proxy.log.slice(logStart) };
}

async function invalidEvent() {
  const name = 'invalid-event';
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  page.on('console', (m) => consoleLines.push(`${name}: ${m.type()}: ${m.text()}`));
  page.on('requestfailed', (r) => consoleLines.push(`${name}: request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText}`));
  const logStart = proxy.log.length;
  await page.goto(`${origin}/send.html?key=${encodeURIComponent(writeKey)}&api=${encodeURIComponent(proxy.url)}&strategy=batching`);
  await page.evaluate(() => window.ready);

  // Ten events fill the batch, which goes out at once; the seventh is a track without its name.
  const ids = Array.from({ length: 10 }, (_, i) => `${run}-${name}-${i}`);
  const invalid = ids[6];
  await page.evaluate(
    async (ids, invalid) => {
      await ajs.addSourceMiddleware(({ payload, next }) => {
        if (payload.obj.messageId === invalid) delete payload.obj.event;
        next(payload);
      });
      const o = (i) => ({ messageId: ids[i] });
      ajs.identify('user-1', { plan: 'pro' }, o(0));
      ajs.page('Shop', 'Home', { path: '/home' }, o(1));
      ajs.group('group-1', { name: 'Team' }, o(2));
      ajs.alias('user-1', 'anon-1', o(3));
      for (let i = 4; i < ids.length; i++) ajs.track('Clicked', { i }, o(i));
    },
    ids,
    invalid,
  );

  // tests/ingest/clients.rs checks that one request carried them.
  const answered = () => ids.every((i) => proxy.log.slice(logStart).some((r) => r.method === 'POST' && r.status !== null && r.ids.includes(i)));
  await waitFor('every event to be answered', answered, 20_000);
  await context.close();
  return { name, expected: ids.filter((i) => i !== invalid), invalid, requests: proxy.log.slice(logStart) };
}

let out;
try {
  const scenarios = [];
  if (only === 'invalid-event') scenarios.push(await invalidEvent());
  else for (const strategy of ['standard', 'batching']) scenarios.push(await scenario(strategy));
  out = { scenarios, console: consoleLines };
} catch (e) {
  console.error(`browser test failed: ${e.stack ?? e}\nproxy log: ${JSON.stringify(proxy.log)}\nconsole:\n${consoleLines.join('\n')}`);
  process.exitCode = 1;
} finally {
  await browser.close();
  await proxy.close();
  pages.close();
}
if (out) console.log(JSON.stringify(out));

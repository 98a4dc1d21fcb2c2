// Segment's Node library (@segment/analytics-node) against `dedupe ingest`, run by
// tests/ingest.rs, which checks what it prints and what reached Kafka.
//
// 1. One message of each type through a proxy that drops the first accepted answer: the library
//    retries the batch with the same messageIds (and X-Retry-Count), so Kafka gets duplicates.
// 2. Sixty track events in batches of fifteen against an ingest whose rate limit is lower: the
//    library is answered 429 with Retry-After, waits, and sends them again until all are taken.
//
// Environment: INGEST_URL, WRITE_KEY. Prints one JSON line: { sent, errors, requests }.

import { Analytics } from '@segment/analytics-node';
import { env, startProxy } from './proxy.mjs';

const ingest = env('INGEST_URL');
const writeKey = env('WRITE_KEY');
const errors = [];
const sent = { retry: [], rateLimited: [] };

function client(host, flushAt) {
  const analytics = new Analytics({ writeKey, host, flushAt, flushInterval: 200, maxRetries: 5, httpRequestTimeout: 10_000 });
  analytics.on('error', (e) => errors.push(String(e?.reason ?? e?.code ?? e)));
  return analytics;
}

/** Queues a message; resolves with its messageId once the library is done with it. */
function send(analytics, method, message, into) {
  return new Promise((resolve) => {
    analytics[method](message, (err, ctx) => {
      if (err) errors.push(`${method}: ${err?.reason ?? err}`);
      into.push(ctx.event.messageId);
      resolve();
    });
  });
}

const dropping = await startProxy({ upstream: ingest, dropFirstAccepted: true });
const first = client(dropping.url, 6);
await Promise.all([
  send(first, 'track', { userId: 'u-node', event: 'Song Played', properties: { n: 1 } }, sent.retry),
  send(first, 'identify', { userId: 'u-node', traits: { plan: 'pro' } }, sent.retry),
  send(first, 'page', { anonymousId: 'a-node', name: 'Home' }, sent.retry),
  send(first, 'screen', { userId: 'u-node', name: 'Feed' }, sent.retry),
  send(first, 'group', { userId: 'u-node', groupId: 'g-1' }, sent.retry),
  send(first, 'alias', { previousId: 'a-node', userId: 'u-node' }, sent.retry),
]);
await first.closeAndFlush({ timeout: 20_000 });
await dropping.close();

const recording = await startProxy({ upstream: ingest });
const second = client(recording.url, 15);
const burst = [];
for (let i = 0; i < 60; i++) {
  burst.push(send(second, 'track', { userId: `u-${i % 7}`, event: 'Burst', properties: { i } }, sent.rateLimited));
}
await Promise.all(burst);
await second.closeAndFlush({ timeout: 30_000 });
await recording.close();

console.log(JSON.stringify({ sent, errors, requests: { retry: dropping.log, rateLimited: recording.log } }));

// Segment's Node library (@segment/analytics-node) sends a batch in which one event is invalid,
// run by tests/ingest/clients.rs, which checks what it prints and what reached Kafka.
//
// Ten track events in one batch (flushAt 10), the fifth with a 300-character messageId: the
// library lets any string through as a messageId, the tracking API takes at most 256 bytes. The
// answer is 200 naming the fifth, so the library reports no error for any of the ten.
//
// Environment: INGEST_URL, WRITE_KEY. Prints one JSON line: { valid, invalid, errors, requests }.

import { randomUUID } from 'node:crypto';
import { Analytics } from '@segment/analytics-node';
import { env, startProxy } from './proxy.mjs';

const INVALID_INDEX = 4;
const run = randomUUID();
const ids = Array.from({ length: 10 }, (_, i) => `${run}-${i}`);
ids[INVALID_INDEX] = `${run}-`.padEnd(300, 'x');

const errors = [];
const proxy = await startProxy({ upstream: env('INGEST_URL') });
// The flush interval is long, so the batch goes out because it holds ten events, not on a timer.
const analytics = new Analytics({ writeKey: env('WRITE_KEY'), host: proxy.url, flushAt: 10, flushInterval: 20_000, maxRetries: 1 });
analytics.on('error', (e) => errors.push(String(e?.reason ?? e?.code ?? e)));
await Promise.all(
  ids.map(
    (messageId, i) =>
      new Promise((resolve) => {
        analytics.track({ userId: 'u-node', event: 'Clicked', properties: { i }, messageId }, (err) => {
          if (err) errors.push(`track ${i}: ${err?.reason ?? err}`);
          resolve();
        });
      }),
  ),
);
await analytics.closeAndFlush({ timeout: 10_000 });
await proxy.close();

const valid = ids.filter((_, i) => i !== INVALID_INDEX);
console.log(JSON.stringify({ valid, invalid: { index: INVALID_INDEX, messageId: ids[INVALID_INDEX] }, errors, requests: proxy.log }));

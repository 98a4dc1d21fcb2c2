// A loopback HTTP proxy in front of `dedupe ingest` that records every request and what the
// ingest answered, and can play a bad network: hold answers (so a page navigates away while its
// requests are in flight), or drop the first accepted answer (so the client never hears that
// Kafka has its events, and sends them again).
//
// A page's library finds its API through the settings document, which points at the ingest's
// `ingest.public_url`: a test that sends a page through the proxy starts the ingest with that set
// to the proxy's address, and the proxy on the port it names (`port`).

import http from 'node:http';
import zlib from 'node:zlib';

/** The messageIds a request body carries (a batch's, or a single message's). */
function messageIds(headers, body) {
  try {
    const raw = headers['content-encoding'] === 'gzip' ? zlib.gunzipSync(body) : body;
    const json = JSON.parse(raw.toString('utf8'));
    const items = Array.isArray(json.batch) ? json.batch : [json];
    return items.map((m) => m.messageId ?? null);
  } catch {
    return [];
  }
}

/**
 * Starts the proxy on 127.0.0.1.
 * upstream: the ingest's base URL. port: where to listen (0: any free port). holdMs: how long to hold each POST's answer. dropFirstAccepted:
 * close the client's connection instead of passing on the first 200.
 * Resolves to { port, url, log, close }; `log` holds one entry per request, in arrival order.
 */
export function startProxy({ upstream, holdMs = 0, dropFirstAccepted = false, port = 0 }) {
  const target = new URL(upstream);
  const log = [];
  let dropped = false;
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const entry = {
        method: req.method,
        path: req.url,
        origin: req.headers.origin ?? null,
        contentType: req.headers['content-type'] ?? null,
        retryCount: req.headers['x-retry-count'] ?? null,
        ids: req.method === 'POST' ? messageIds(req.headers, body) : [],
        status: null,
        allowOrigin: null,
        retryAfter: null,
        // The ingest's answer, as JSON (null if it was not JSON).
        answer: null,
        dropped: false,
        clientGone: false,
        // When the request had arrived, and when its answer was passed on (null: never).
        receivedAt: Date.now(),
        answeredAt: null,
      };
      log.push(entry);
      res.on('close', () => {
        if (!res.writableFinished) entry.clientGone = true;
      });
      // A connection of its own for each request (`agent: false`): reusing a pooled one races the
      // server closing it when idle, which fails the forwarded request with "socket hang up"
      // before the front door has seen it, and the test would blame the front door.
      const upstreamReq = http.request(
        { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers, agent: false },
        (up) => {
          const answer = [];
          up.on('data', (c) => answer.push(c));
          up.on('end', () => {
            entry.status = up.statusCode;
            entry.allowOrigin = up.headers['access-control-allow-origin'] ?? null;
            entry.retryAfter = up.headers['retry-after'] ?? null;
            try {
              entry.answer = JSON.parse(Buffer.concat(answer).toString('utf8'));
            } catch {
              entry.answer = null;
            }
            if (dropFirstAccepted && !dropped && req.method === 'POST' && up.statusCode === 200) {
              // Kafka has the events; the client never hears it.
              dropped = true;
              entry.dropped = true;
              req.socket.destroy();
              return;
            }
            const reply = () => {
              if (res.destroyed) {
                entry.clientGone = true;
                return;
              }
              entry.answeredAt = Date.now();
              res.writeHead(up.statusCode, up.headers);
              res.end(Buffer.concat(answer));
            };
            if (req.method === 'POST' && holdMs > 0) setTimeout(reply, holdMs);
            else reply();
          });
        },
      );
      upstreamReq.on('error', (e) => {
        entry.status = `proxy error: ${e.message}`;
        res.destroy();
      });
      upstreamReq.end(body);
    });
  });
  return new Promise((resolve) => {
    server.listen(port, '127.0.0.1', () => {
      const { port } = server.address();
      resolve({
        port,
        url: `http://127.0.0.1:${port}`,
        log,
        close: () =>
          new Promise((done) => {
            server.closeAllConnections();
            server.close(done);
          }),
      });
    });
  });
}

/** Waits until `check()` is true, polling every 50 ms; throws with `what` after `timeoutMs`. */
export async function waitFor(what, check, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Reads a required environment variable. */
export function env(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

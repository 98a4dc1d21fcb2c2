// Serves the pages of pages.mjs until stopped, for deploy/local/demo.sh --browser.
// Environment: PAGE_PORT (default 8000). Prints the address it listens on.

import { startPageServer } from './pages.mjs';

const port = Number(process.env.PAGE_PORT ?? 8000);
await startPageServer({ host: '127.0.0.1', port });
console.log(`pages: listening on http://localhost:${port}`);

// The page's service worker: it keeps the page's own files so that the page
// opens (and its outbox can be filled) without a network. Network first:
// while the server answers, its files are fresh; without it, the copy kept
// last is served. It never touches anything outside /app/ — API requests,
// their tokens and their answers go to the network untouched and are never
// stored.

const CACHE = 'orders-api-app';
const FILES = ['./', 'app.css', 'icon.svg', 'main.js', 'outbox.js', 'drain.js', 'orders.js'];
const SCOPE = new URL('./', self.location).pathname; // "/app/"

self.addEventListener('install', (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll(FILES)).then(() => self.skipWaiting()));
});

self.addEventListener('activate', (event) => {
  event.waitUntil(self.clients.claim());
});

self.addEventListener('fetch', (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== 'GET' || url.origin !== self.location.origin || !url.pathname.startsWith(SCOPE)) {
    return; // not the page's: the browser sends it as if there were no worker
  }
  event.respondWith((async () => {
    const cache = await caches.open(CACHE);
    try {
      // The files are served `no-cache`: the browser asks the server each time.
      const fresh = await fetch(event.request);
      if (fresh.ok) await cache.put(event.request, fresh.clone());
      return fresh;
    } catch (error) {
      // A module script is asked for with an Origin header, which the
      // server's answers vary on; the files themselves do not.
      const kept = await cache.match(event.request, { ignoreSearch: true, ignoreVary: true });
      if (kept) return kept;
      throw error;
    }
  })());
});

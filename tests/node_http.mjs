// The bridge the test servers on the TypeScript SDK share: a node:http request becomes the fetch
// Request the SDK's handler takes, and its fetch Response is streamed back out through node:http.
// Only Node built-ins, so a server in any test folder imports it whatever its node_modules.

export async function readBody(req) {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    return Buffer.concat(chunks);
}

// The fetch Request for `req` whose body was read; aborted when the client's connection closes, so
// the handler stops working for a client that has left.
export function fetchRequest(req, res, body) {
    const headers = new Headers();
    for (const [name, value] of Object.entries(req.headers)) {
        headers.set(name, Array.isArray(value) ? value.join(', ') : value);
    }
    const abort = new AbortController();
    res.on('close', () => abort.abort());
    return new Request(`http://${req.headers.host ?? 'localhost'}${req.url}`, {
        method: req.method,
        headers,
        body: body && body.length ? body : undefined,
        signal: abort.signal
    });
}

// A stream's head goes out at once, before its first event, then each chunk as it comes.
export async function sendResponse(res, response) {
    res.writeHead(response.status, Object.fromEntries(response.headers.entries()));
    res.flushHeaders();
    if (response.body) {
        for await (const chunk of response.body) res.write(chunk);
    }
    res.end();
}

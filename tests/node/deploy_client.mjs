// The official TypeScript MCP client against two instances of examples/deploy_server.py.
//
// A fetch wrapper plays the load balancer: the n-th request of each JSON-RPC method goes
// to instance n mod 2, so round 1 of tools/call lands on the first URL and round 2 on the
// second. The client negotiates 2026-07-28 (`versionNegotiation: {mode: 'auto'}`) and
// drives the multi-round-trip request itself, answering both elicitations of round 1.
//
// usage: node deploy_client.mjs --urls URL_A,URL_B --token BEARER --version 1.2.3
// prints one JSON line: {"result": CallToolResult, "toolCalls": [{round, url, requestState}]}
import { parseArgs } from 'node:util';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const { values } = parseArgs({
    options: {
        urls: { type: 'string' },
        token: { type: 'string', default: 'alice-token' },
        version: { type: 'string', default: '1.2.3' },
        tool: { type: 'string', default: 'deploy_production' }
    }
});
const urls = values.urls.split(',');
const counts = new Map();
const toolCalls = [];

async function balancedFetch(input, init) {
    let method = 'GET';
    let params = {};
    if (init && typeof init.body === 'string') {
        const message = JSON.parse(init.body);
        method = message.method ?? 'response';
        params = message.params ?? {};
    }
    const n = counts.get(method) ?? 0;
    counts.set(method, n + 1);
    const target = urls[n % urls.length];
    if (method === 'tools/call') {
        toolCalls.push({ round: toolCalls.length + 1, url: target, requestState: params.requestState ?? null });
    }
    return fetch(target, init);
}

const client = new Client(
    { name: 'statecodec-deploy-test', version: '1.0.0' },
    { capabilities: { elicitation: { form: {} } }, versionNegotiation: { mode: 'auto' } }
);
client.setRequestHandler('elicitation/create', async request => {
    const properties = request.params.requestedSchema?.properties ?? {};
    if ('confirm' in properties) {
        return { action: 'accept', content: { confirm: true } };
    }
    return { action: 'accept', content: { ticket: 'CHG-1234' } };
});

const transport = new StreamableHTTPClientTransport(new URL(urls[0]), {
    fetch: balancedFetch,
    requestInit: { headers: { Authorization: `Bearer ${values.token}` } }
});

try {
    await client.connect(transport);
    const result = await client.callTool({ name: values.tool, arguments: { version: values.version } });
    console.log(JSON.stringify({ result, toolCalls }));
} finally {
    await client.close();
}

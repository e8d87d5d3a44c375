// The official TypeScript MCP client against two instances of examples/deploy_server.py.
//
// A fetch wrapper plays the load balancer: the n-th request of each JSON-RPC method goes
// to instance n mod 2, so round 1 of tools/call lands on the first URL and round 2 on the
// second. The client negotiates 2026-07-28 (`versionNegotiation: {mode: 'auto'}`) and
// drives the multi-round-trip request itself, answering both elicitations of round 1.
//
// --tool NAME --arguments JSON call another tool (the flow tests' wait_for_approval and
// three_questions); any other elicitation is answered with "<field>-answer" for each field.
// The client runs at its defaults (maxRounds 10, 250 ms before a requestState-only retry).
//
// usage: node deploy_client.mjs --urls URL_A,URL_B --token BEARER --version 1.2.3
// prints one JSON line: {"result": CallToolResult, "toolCalls": [{round, url, requestState, at}]}
// or, when the call fails, {"error": {"name", "message", "code"}, "toolCalls": [...]}
import { parseArgs } from 'node:util';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const { values } = parseArgs({
    options: {
        urls: { type: 'string' },
        token: { type: 'string', default: 'alice-token' },
        version: { type: 'string', default: '1.2.3' },
        tool: { type: 'string', default: 'deploy_production' },
        arguments: { type: 'string' }
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
        toolCalls.push({
            round: toolCalls.length + 1,
            url: target,
            requestState: params.requestState ?? null,
            at: Date.now() / 1000
        });
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
    if ('ticket' in properties) {
        return { action: 'accept', content: { ticket: 'CHG-1234' } };
    }
    return { action: 'accept', content: Object.fromEntries(Object.keys(properties).map(f => [f, `${f}-answer`])) };
});

const transport = new StreamableHTTPClientTransport(new URL(urls[0]), {
    fetch: balancedFetch,
    requestInit: { headers: { Authorization: `Bearer ${values.token}` } }
});

const args = values.arguments ? JSON.parse(values.arguments) : { version: values.version };
try {
    await client.connect(transport);
    try {
        const result = await client.callTool({ name: values.tool, arguments: args });
        console.log(JSON.stringify({ result, toolCalls }));
    } catch (err) {
        console.log(JSON.stringify({ error: { name: err?.name, message: String(err?.message ?? err), code: err?.code ?? null }, toolCalls }));
    }
} finally {
    await client.close();
}

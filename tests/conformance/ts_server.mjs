// statecodec's TypeScript conformance server: every 2026-07-28 server scenario of the official
// harness (@modelcontextprotocol/conformance, `conformance list`), on the REAL TypeScript SDK
// (@modelcontextprotocol/server, pinned in package.json beside this file).
//
// It is the SDK serving the way its documentation says a careful deployment does: the modern
// entry `createMcpHandler`, DNS-rebinding protection in front of it (`hostHeaderValidationResponse`
// and `originValidationResponse` with the loopback lists), and the SDK's own requestState
// integrity check (`createRequestStateCodec`, HMAC, a per-process key) as `requestState.verify`.
// What the harness finds wrong here is the SDK's, recorded in expected-failures.yaml; what it
// finds wrong only behind `statecodec proxy` is statecodec's (scripts/conformance).
//
// usage: node ts_server.mjs [--host 127.0.0.1] [--port 0]
// prints "READY http://HOST:PORT/mcp" once listening; stops on SIGTERM.
import { randomBytes, randomUUID } from 'node:crypto';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';
import {
    CLIENT_CAPABILITIES_META_KEY,
    McpServer,
    ProtocolError,
    ProtocolErrorCode,
    ResourceTemplate,
    acceptedContent,
    createMcpHandler,
    createRequestStateCodec,
    fromJsonSchema,
    hostHeaderValidationResponse,
    inputRequired,
    localhostAllowedHostnames,
    localhostAllowedOrigins,
    originValidationResponse
} from '@modelcontextprotocol/server';
import { z } from 'zod';
import { fetchRequest, readBody, sendResponse } from '../node_http.mjs';

const { values } = parseArgs({
    options: { host: { type: 'string', default: '127.0.0.1' }, port: { type: 'string', default: '0' } }
});

// A 1x1 PNG and a tiny WAV: the scenarios only check the media type and that data is base64.
const PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const WAV = 'UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=';

// requestState is attacker-controlled: the SDK's own HMAC codec checks it before a handler runs.
const stateCodec = createRequestStateCodec({ key: randomBytes(32) });

const text = value => ({ type: 'text', text: value });
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function form(message, field, schema) {
    return inputRequired.elicit({
        message,
        requestedSchema: { type: 'object', properties: { [field]: schema }, required: [field] }
    });
}

const askName = (message = 'What is your name?') => form(message, 'name', { type: 'string' });
const askConfirm = () => form('Please confirm', 'ok', { type: 'boolean' });

// The JSON Schema 2020-12 fixture of the json-schema-2020-12 scenario (SEP-1613, SEP-2106).
const SCHEMA_2020_12 = {
    $schema: 'https://json-schema.org/draft/2020-12/schema',
    type: 'object',
    $defs: {
        address: {
            $anchor: 'addressDef',
            type: 'object',
            properties: { street: { type: 'string' }, city: { type: 'string' } }
        }
    },
    properties: {
        name: { type: 'string' },
        address: { $ref: '#/$defs/address' },
        contactMethod: { type: 'string', enum: ['phone', 'email'] },
        phone: { type: 'string' },
        email: { type: 'string' }
    },
    allOf: [{ anyOf: [{ required: ['phone'] }, { required: ['email'] }] }],
    if: { properties: { contactMethod: { const: 'phone' } }, required: ['contactMethod'] },
    then: { required: ['phone'] },
    else: { required: ['email'] },
    additionalProperties: false
};

// Tools that answer one fixed result: name -> [description, result].
const FIXED_TOOLS = {
    test_simple_text: ['Simple text content', { content: [text('This is a simple text response for testing.')] }],
    test_image_content: ['Image content', { content: [{ type: 'image', data: PNG, mimeType: 'image/png' }] }],
    test_audio_content: ['Audio content', { content: [{ type: 'audio', data: WAV, mimeType: 'audio/wav' }] }],
    test_embedded_resource: [
        'Embedded resource content',
        {
            content: [
                {
                    type: 'resource',
                    resource: {
                        uri: 'test://embedded-resource',
                        mimeType: 'text/plain',
                        text: 'This is an embedded resource content.'
                    }
                }
            ]
        }
    ],
    test_multiple_content_types: [
        'Text, image and resource content',
        {
            content: [
                text('Multiple content types test:'),
                { type: 'image', data: PNG, mimeType: 'image/png' },
                {
                    type: 'resource',
                    resource: {
                        uri: 'test://mixed-content-resource',
                        mimeType: 'application/json',
                        text: JSON.stringify({ test: 'data', value: 123 })
                    }
                }
            ]
        }
    ],
    test_streaming_elicitation: ['A plain result: no request on the response stream', { content: [text('done')] }]
};

function registerContentTools(server) {
    for (const [name, [description, result]] of Object.entries(FIXED_TOOLS)) {
        server.registerTool(name, { description, inputSchema: z.object({}) }, async () => result);
    }
    server.registerTool('test_error_handling', { description: 'Always fails', inputSchema: z.object({}) }, async () => {
        throw new Error('This tool intentionally returns an error for testing');
    });
    server.registerTool(
        'test_tool_with_progress',
        { description: 'Reports progress 0, 50, 100', inputSchema: z.object({}) },
        async (_args, ctx) => {
            const progressToken = ctx.mcpReq._meta?.progressToken;
            for (const progress of [0, 50, 100]) {
                if (progressToken !== undefined) {
                    await ctx.mcpReq.notify({
                        method: 'notifications/progress',
                        params: { progressToken, progress, total: 100 }
                    });
                }
                if (progress < 100) await sleep(50);
            }
            return { content: [text(`progress reported (${progressToken ?? 'no token'})`)] };
        }
    );
    server.registerTool(
        'test_logging_tool',
        { description: 'Logs through the request-scoped channel', inputSchema: z.object({}) },
        async (_args, ctx) => {
            await ctx.mcpReq.log('info', 'test_logging_tool ran');
            return { content: [text('logged')] };
        }
    );
    server.registerTool(
        'json_schema_2020_12_tool',
        { description: 'Tool with JSON Schema 2020-12 features', inputSchema: fromJsonSchema(SCHEMA_2020_12) },
        async args => ({ content: [text(`called with ${JSON.stringify(args)}`)] })
    );
    server.registerTool(
        'test_x_mcp_header',
        {
            description: 'SEP-2243: region is mirrored into Mcp-Param-Region',
            inputSchema: fromJsonSchema({
                type: 'object',
                properties: {
                    region: { type: 'string', 'x-mcp-header': 'Region' },
                    level: { type: 'integer' }
                }
            })
        },
        async args => ({ content: [text(`region=${args.region ?? '<none>'}`)] })
    );
}

function registerListenTriggers(server, handler) {
    // server-stateless: a call publishes a list_changed event to the open subscriptions/listen streams.
    server.registerTool('test_trigger_tool_change', { description: 'Publishes tools/list_changed', inputSchema: z.object({}) }, async () => {
        handler.current.notify.toolsChanged();
        return { content: [text('tools list changed')] };
    });
    server.registerTool('test_trigger_prompt_change', { description: 'Publishes prompts/list_changed', inputSchema: z.object({}) }, async () => {
        handler.current.notify.promptsChanged();
        return { content: [text('prompts list changed')] };
    });
    server.registerTool(
        'test_missing_capability',
        { description: 'Needs the sampling capability (an in-band createMessage request)', inputSchema: z.object({}) },
        async (_args, ctx) => {
            if (ctx.mcpReq.inputResponses?.llm_answer !== undefined) return { content: [text('sampled')] };
            return inputRequired({
                inputRequests: {
                    llm_answer: inputRequired.createMessage({ messages: [{ role: 'user', content: text('Say pong') }], maxTokens: 16 })
                }
            });
        }
    );
}

function registerInputRequiredTools(server) {
    const tool = (name, handler) => server.registerTool(name, { description: `SEP-2322: ${name}`, inputSchema: z.object({}) }, handler);
    tool('test_input_required_result_elicitation', async (_args, ctx) => {
        const name = acceptedContent(ctx.mcpReq.inputResponses, 'user_name')?.name;
        if (typeof name !== 'string') return inputRequired({ inputRequests: { user_name: askName() } });
        return { content: [text(`Hello, ${name}!`)] };
    });
    tool('test_input_required_result_sampling', async (_args, ctx) => {
        const answer = ctx.mcpReq.inputResponses?.capital_question;
        if (answer === undefined) {
            return inputRequired({
                inputRequests: {
                    capital_question: inputRequired.createMessage({
                        messages: [{ role: 'user', content: text('What is the capital of France?') }],
                        maxTokens: 100
                    })
                }
            });
        }
        return { content: [text(`Sampling response: ${answer.content?.text ?? JSON.stringify(answer)}`)] };
    });
    tool('test_input_required_result_list_roots', async (_args, ctx) => {
        const roots = ctx.mcpReq.inputResponses?.client_roots?.roots;
        if (!Array.isArray(roots)) return inputRequired({ inputRequests: { client_roots: inputRequired.listRoots() } });
        return { content: [text(`roots: ${roots.map(root => root.uri).join(', ')}`)] };
    });
    tool('test_input_required_result_request_state', async (_args, ctx) => {
        if (acceptedContent(ctx.mcpReq.inputResponses, 'confirm') === undefined) {
            const requestState = await stateCodec.mint({ tool: 'request_state', nonce: randomUUID() });
            return inputRequired({ inputRequests: { confirm: askConfirm() }, requestState });
        }
        if (ctx.mcpReq.requestState()?.tool !== 'request_state') {
            throw new ProtocolError(ProtocolErrorCode.InvalidParams, 'requestState missing or not this tool’s');
        }
        return { content: [text('state-ok: requestState verified')] };
    });
    tool('test_input_required_result_multiple_inputs', async (_args, ctx) => {
        const responses = ctx.mcpReq.inputResponses;
        const name = acceptedContent(responses, 'user_name')?.name;
        const greeting = responses?.greeting?.content?.text;
        const roots = responses?.client_roots?.roots;
        if (typeof name === 'string' && typeof greeting === 'string' && Array.isArray(roots)) {
            return { content: [text(`${greeting} ${name} (${roots.length} roots)`)] };
        }
        return inputRequired({
            inputRequests: {
                user_name: askName(),
                greeting: inputRequired.createMessage({ messages: [{ role: 'user', content: text('Generate a greeting') }], maxTokens: 50 }),
                client_roots: inputRequired.listRoots()
            },
            requestState: await stateCodec.mint({ tool: 'multiple_inputs', nonce: randomUUID() })
        });
    });
    tool('test_input_required_result_multi_round', async (_args, ctx) => multiRound(ctx));
    tool('test_input_required_result_tampered_state', async (_args, ctx) => {
        if (ctx.mcpReq.requestState() !== undefined && acceptedContent(ctx.mcpReq.inputResponses, 'confirm') !== undefined) {
            return { content: [text('integrity-ok')] };
        }
        const requestState = await stateCodec.mint({ tool: 'tampered_state', nonce: randomUUID() });
        return inputRequired({ inputRequests: { confirm: askConfirm() }, requestState });
    });
    tool('test_input_required_result_capabilities', async (_args, ctx) => {
        if (ctx.mcpReq.inputResponses !== undefined) return { content: [text('capability-aware input received')] };
        const declared = ctx.mcpReq.envelope?.[CLIENT_CAPABILITIES_META_KEY] ?? {};
        const inputRequests = {};
        if (declared.elicitation !== undefined) inputRequests.user_name = askName();
        if (declared.sampling !== undefined) {
            inputRequests.greeting = inputRequired.createMessage({ messages: [{ role: 'user', content: text('Say hello') }], maxTokens: 50 });
        }
        if (declared.roots !== undefined) inputRequests.client_roots = inputRequired.listRoots();
        if (Object.keys(inputRequests).length === 0) return { content: [text('no declared capability takes an input request')] };
        return inputRequired({ inputRequests });
    });
}

async function multiRound(ctx) {
    const state = ctx.mcpReq.requestState();
    const round = state?.tool === 'multi_round' ? state.round : 0;
    if (round === 1) {
        const name = acceptedContent(ctx.mcpReq.inputResponses, 'step1')?.name;
        if (typeof name === 'string') {
            return inputRequired({
                inputRequests: { step2: form('Step 2: What is your favorite color?', 'color', { type: 'string' }) },
                requestState: await stateCodec.mint({ tool: 'multi_round', round: 2, name, nonce: randomUUID() })
            });
        }
    } else if (round === 2) {
        const color = acceptedContent(ctx.mcpReq.inputResponses, 'step2')?.color;
        if (typeof color === 'string') return { content: [text(`${state.name} likes ${color}`)] };
    }
    return inputRequired({
        inputRequests: { step1: askName('Step 1: What is your name?') },
        requestState: await stateCodec.mint({ tool: 'multi_round', round: 1, nonce: randomUUID() })
    });
}

function registerResources(server) {
    const read = (uri, mimeType, body) => async () => ({ contents: [{ uri, mimeType, ...body }] });
    server.registerResource(
        'static-text',
        'test://static-text',
        { description: 'A static text resource', mimeType: 'text/plain' },
        read('test://static-text', 'text/plain', { text: 'This is the content of the static text resource.' })
    );
    server.registerResource(
        'static-binary',
        'test://static-binary',
        { description: 'A static binary resource (a PNG)', mimeType: 'image/png' },
        read('test://static-binary', 'image/png', { blob: PNG })
    );
    server.registerResource(
        'template',
        new ResourceTemplate('test://template/{id}/data', { list: undefined }),
        { description: 'A resource template', mimeType: 'application/json' },
        async (uri, { id }) => ({
            contents: [
                {
                    uri: uri.href,
                    mimeType: 'application/json',
                    text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` })
                }
            ]
        })
    );
}

function registerPrompts(server) {
    const user = content => ({ role: 'user', content });
    server.registerPrompt('test_simple_prompt', { description: 'A simple prompt' }, async () => ({
        messages: [user(text('This is a simple prompt for testing.'))]
    }));
    server.registerPrompt(
        'test_prompt_with_arguments',
        { description: 'A prompt with two arguments', argsSchema: z.object({ arg1: z.string(), arg2: z.string() }) },
        async ({ arg1, arg2 }) => ({ messages: [user(text(`Prompt with arguments: arg1='${arg1}', arg2='${arg2}'`))] })
    );
    server.registerPrompt(
        'test_prompt_with_embedded_resource',
        { description: 'A prompt embedding a resource', argsSchema: z.object({ resourceUri: z.string() }) },
        async ({ resourceUri }) => ({
            messages: [
                user({ type: 'resource', resource: { uri: resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } }),
                user(text('Please process the embedded resource above.'))
            ]
        })
    );
    server.registerPrompt('test_prompt_with_image', { description: 'A prompt with an image' }, async () => ({
        messages: [user({ type: 'image', data: PNG, mimeType: 'image/png' }), user(text('Please analyze the image above.'))]
    }));
    server.registerPrompt('test_input_required_result_prompt', { description: 'SEP-2322 on prompts/get' }, async ctx => {
        const context = acceptedContent(ctx.mcpReq.inputResponses, 'user_context')?.context;
        if (typeof context !== 'string') {
            return inputRequired({
                inputRequests: { user_context: form('What context should the prompt use?', 'context', { type: 'string' }) }
            });
        }
        return { messages: [user(text(`Use this context: ${context}`))] };
    });
}

const handler = { current: undefined };

function factory() {
    const server = new McpServer(
        { name: 'statecodec-conformance-ts', version: '1.0.0' },
        {
            capabilities: {
                tools: { listChanged: true },
                resources: { listChanged: true },
                prompts: { listChanged: true },
                completions: {}
            },
            requestState: { verify: stateCodec.verify }
        }
    );
    registerContentTools(server);
    registerListenTriggers(server, handler);
    registerInputRequiredTools(server);
    registerResources(server);
    registerPrompts(server);
    server.server.setRequestHandler('completion/complete', async () => ({ completion: { values: [], total: 0, hasMore: false } }));
    return server;
}

handler.current = createMcpHandler(factory);
const hosts = localhostAllowedHostnames();
const origins = localhostAllowedOrigins();

// node:http in, a fetch Request to the SDK's handler, its streamed Response back out.
const http = createServer(async (req, res) => {
    try {
        const body = req.method === 'POST' ? await readBody(req) : undefined;
        const request = fetchRequest(req, res, body);
        const response =
            hostHeaderValidationResponse(request, hosts) ??
            originValidationResponse(request, origins) ??
            (await handler.current.fetch(request));
        await sendResponse(res, response);
    } catch (err) {
        if (err?.name !== 'AbortError') process.stderr.write(`ts_server: ${err?.stack ?? err}\n`);
        if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
        res.end();
    }
});

http.listen(Number(values.port), values.host, () => {
    const { port } = http.address();
    const host = values.host.includes(':') ? `[${values.host}]` : values.host;
    process.stdout.write(`READY http://${host}:${port}/mcp\n`);
});

process.on('SIGTERM', () => {
    handler.current.close().finally(() => http.close(() => process.exit(0)));
    setTimeout(() => process.exit(0), 2000).unref();
});

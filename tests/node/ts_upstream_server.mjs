// The deploy scenario on the REAL TypeScript SDK server (@modelcontextprotocol/server, see
// package.json) with NO requestState protection: no `requestState.verify` is configured, so
// `ctx.mcpReq.requestState()` returns the raw wire string and the tool trusts it as its own
// plan. This is the upstream the statecodec proxy tests put behind `statecodec proxy`.
//
// The tool `deploy_production(version)` plans a deployment, asks `confirm_deploy` and
// `change_ticket` in ONE input_required round with the plan as plaintext JSON in
// requestState, and on the retry deploys the plan it reads back.
//
// The tool `nested_meta(depth)` asks the same way, with a fresh secret in requestState and
// an `_meta` nested `depth` levels deep (as a server echoing a large request would): the
// proxy must read an answer of any depth that a JavaScript client can read.
//
// --record PATH appends one JSON line per requestState the server issued ({"issued": ...})
// and per requestState found in any JSON-RPC message of any POST body ({"received": ...,
// "method": ...}), read from the raw HTTP body before the SDK sees it.
//
// --codec protects the state with the SDK's own createRequestStateCodec (HMAC-SHA256, key from
// $REQUEST_STATE_KEY as hex, else a random one; lifetime --ttl seconds, no bind) as its
// `requestState.verify` hook: tampering is rejected, replay is not. --second-tool adds
// `deploy_staging(version)`, the same flow under another name (for cross-tool checks).
//
// --flows adds the multi-round tools of the flow tests: `wait_for_approval(ticket, checks=3)`
// answers requestState-only rounds (the checks so far in requestState) until the approval
// arrives at the `checks`-th retry; `three_questions(topic)` asks one question per round,
// three rounds. Each handler run is recorded ({"run": TOOL, "step": N, "at": SECONDS}).
//
// --host-check puts the SDK's own DNS-rebinding check on Host (hostHeaderValidationResponse with
// the loopback names) in front of the handler, as a careful deployment does: the proxy must let
// it see the Host the client sent. The tool `touch_tools` publishes tools/list_changed to the
// open subscriptions/listen streams (SEP-2575), so a test can watch one pass through the proxy.
//
// usage: node ts_upstream_server.mjs [--port 0] [--record PATH] [--response-mode auto|sse|json]
//                                    [--codec [--ttl SECONDS]] [--second-tool] [--flows] [--host-check]
// prints "READY http://127.0.0.1:PORT/mcp" once listening; stops on SIGTERM.
import { appendFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import {
    McpServer,
    acceptedContent,
    createMcpHandler,
    createRequestStateCodec,
    hostHeaderValidationResponse,
    inputRequired,
    localhostAllowedHostnames
} from '@modelcontextprotocol/server';
import { z } from 'zod';
import { fetchRequest, readBody, sendResponse } from '../node_http.mjs';

const { values } = parseArgs({
    options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '0' },
        record: { type: 'string' },
        instance: { type: 'string', default: 'T' },
        'response-mode': { type: 'string', default: 'auto' },
        codec: { type: 'boolean', default: false },
        ttl: { type: 'string', default: '600' },
        'second-tool': { type: 'boolean', default: false },
        flows: { type: 'boolean', default: false },
        'host-check': { type: 'boolean', default: false }
    }
});

const codec = values.codec
    ? createRequestStateCodec({
          key: process.env.REQUEST_STATE_KEY ? Buffer.from(process.env.REQUEST_STATE_KEY, 'hex') : randomBytes(32),
          ttlSeconds: Number(values.ttl)
      })
    : undefined;

function record(entry) {
    if (values.record) {
        appendFileSync(values.record, JSON.stringify(entry) + '\n');
    }
}

function form(message, field, schema) {
    return inputRequired.elicit({
        message,
        requestedSchema: { type: 'object', properties: { [field]: schema }, required: [field] }
    });
}

async function ask(plan) {
    const state = codec ? await codec.mint(plan) : JSON.stringify(plan);
    record({ issued: state });
    return inputRequired({
        inputRequests: {
            confirm_deploy: form(`Deploy ${plan.version} to production?`, 'confirm', { type: 'boolean', title: 'Confirm' }),
            change_ticket: form('Change ticket for the deployment', 'ticket', { type: 'string', title: 'Ticket' })
        },
        requestState: state
    });
}

async function deploy(version, ctx, environment) {
    const state = ctx.mcpReq.requestState();
    if (state === undefined) {
        return ask({
            version,
            plan_id: randomBytes(4).toString('hex'),
            planned_on: values.instance,
            steps: [`canary ${version} in eu-west-1`, `roll ${version} to all regions`, 'verify health checks']
        });
    }
    // Without --codec, trusted as it is: that is the point of this server. With it, the SDK's
    // verify hook has checked the MAC and expiry and hands over the decoded plan.
    const plan = codec ? state : JSON.parse(state);
    const confirm = acceptedContent(ctx.mcpReq.inputResponses, 'confirm_deploy');
    const ticket = acceptedContent(ctx.mcpReq.inputResponses, 'change_ticket');
    if (confirm === undefined || ticket === undefined) {
        return ask(plan);
    }
    const outcome = {
        deployed: confirm.confirm === true ? plan.version : null,
        plan_id: plan.plan_id,
        steps: plan.steps,
        ticket: String(ticket.ticket),
        planned_on: plan.planned_on,
        deployed_on: values.instance
    };
    const where = environment === 'production' ? '' : ` to ${environment}`;
    const text = outcome.deployed ? `deployed ${outcome.deployed}${where} (plan ${outcome.plan_id})` : 'cancelled';
    return { content: [{ type: 'text', text }], structuredContent: outcome };
}

function nestedMeta(depth, ctx) {
    if (ctx.mcpReq.requestState() !== undefined) {
        return { content: [{ type: 'text', text: 'done' }] };
    }
    let nested = 'bottom';
    for (let i = 0; i < depth; i++) {
        nested = [nested];
    }
    const state = JSON.stringify({ secret: `PLAINTEXT-${randomBytes(8).toString('hex')}`, depth });
    record({ issued: state });
    const asked = inputRequired({
        inputRequests: { confirm: form('Continue?', 'confirm', { type: 'boolean', title: 'Confirm' }) },
        requestState: state
    });
    return { ...asked, _meta: { 'example.test/echo': nested } };
}

const QUESTIONS = ['colour', 'size', 'count'];
const question = i => (i < QUESTIONS.length ? QUESTIONS[i] : `q${i + 1}`);

function waitForApproval(ticket, checks, ctx) {
    const state = ctx.mcpReq.requestState();
    const done = state === undefined ? 0 : JSON.parse(state).checks;
    record({ run: 'wait_for_approval', step: done, at: Date.now() / 1000, ticket });
    if (done < checks) {
        return inputRequired({ requestState: JSON.stringify({ checks: done + 1 }) });
    }
    return { content: [{ type: 'text', text: `${ticket} approved after ${done} checks` }] };
}

function threeQuestions(topic, count, ctx) {
    const state = ctx.mcpReq.requestState();
    let answers = state === undefined ? [] : JSON.parse(state).answers;
    record({ run: 'three_questions', step: answers.length, at: Date.now() / 1000, topic });
    if (state !== undefined) {
        const field = question(answers.length);
        const reply = acceptedContent(ctx.mcpReq.inputResponses, field);
        if (reply !== undefined) {
            answers = [...answers, String(reply[field])];
        }
    }
    if (answers.length < count) {
        const field = question(answers.length);
        return inputRequired({
            inputRequests: { [field]: form(`Which ${field}?`, field, { type: 'string' }) },
            requestState: JSON.stringify({ answers })
        });
    }
    return { content: [{ type: 'text', text: `${topic}: ${answers.join(', ')}` }] };
}

function factory() {
    const options = codec ? { requestState: { verify: codec.verify } } : undefined;
    const server = new McpServer({ name: 'deploy', version: '1.0.0' }, options);
    const environments = values['second-tool'] ? ['production', 'staging'] : ['production'];
    for (const environment of environments) {
        server.registerTool(
            `deploy_${environment}`,
            { description: `Deploy a release to ${environment}`, inputSchema: z.object({ version: z.string() }) },
            async ({ version }, ctx) => deploy(version, ctx, environment)
        );
    }
    if (values.flows) {
        server.registerTool(
            'wait_for_approval',
            {
                description: 'Wait until the change is approved',
                inputSchema: z.object({ ticket: z.string(), checks: z.number().int().min(0).default(3) })
            },
            async ({ ticket, checks }, ctx) => waitForApproval(ticket, checks, ctx)
        );
        server.registerTool(
            'three_questions',
            {
                description: 'Ask three questions, one per round',
                inputSchema: z.object({ topic: z.string(), count: z.number().int().min(0).default(3) })
            },
            async ({ topic, count }, ctx) => threeQuestions(topic, count, ctx)
        );
    }
    server.registerTool(
        'touch_tools',
        { description: 'Publish tools/list_changed to the listen streams', inputSchema: z.object({}) },
        async () => {
            handler.notify.toolsChanged();
            return { content: [{ type: 'text', text: 'tools changed' }] };
        }
    );
    server.registerTool(
        'nested_meta',
        { description: 'Ask, with a deeply nested _meta', inputSchema: z.object({ depth: z.number().int().min(0) }) },
        async ({ depth }, ctx) => nestedMeta(depth, ctx)
    );
    return server;
}

const handler = createMcpHandler(factory, { responseMode: values['response-mode'] });

function noteStates(body) {
    let document;
    try {
        document = JSON.parse(body.toString('utf8'));
    } catch {
        return;
    }
    for (const message of Array.isArray(document) ? document : [document]) {
        const params = message && typeof message === 'object' ? message.params : undefined;
        if (params && typeof params === 'object' && 'requestState' in params) {
            record({ received: params.requestState, method: message.method ?? null });
        }
    }
}

const http = createServer(async (req, res) => {
    try {
        const body = req.method === 'POST' ? await readBody(req) : undefined;
        if (body !== undefined) {
            noteStates(body);
        }
        const request = fetchRequest(req, res, body);
        const refused = values['host-check'] ? hostHeaderValidationResponse(request, localhostAllowedHostnames()) : undefined;
        await sendResponse(res, refused ?? (await handler.fetch(request)));
    } catch (err) {
        process.stderr.write(`ts_upstream_server: ${err?.stack ?? err}\n`);
        if (!res.headersSent) {
            res.writeHead(500, { 'content-type': 'text/plain' });
        }
        res.end();
    }
});

http.listen(Number(values.port), values.host, () => {
    const { port } = http.address();
    process.stdout.write(`READY http://${values.host}:${port}/mcp\n`);
});

process.on('SIGTERM', () => {
    handler.close().finally(() => http.close(() => process.exit(0)));
    setTimeout(() => process.exit(0), 2000).unref();
});

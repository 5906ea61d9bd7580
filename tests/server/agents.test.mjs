// Real agent frameworks, unchanged, against swiftlet-server on loopback with the trained toy model
// (models/toy.qpack): the Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible`: tools and several
// steps), the OpenAI Agents SDK (`@openai/agents` with its chat-completions model), and an MCP
// server from npm (`@modelcontextprotocol/server-memory`, over stdio with the MCP SDK's client)
// whose tools/list feeds a small agent loop. The toy model is no agent: calls are forced with
// tool_choice, answers kept short, and the tests check protocol facts: a tool was called with
// arguments valid under its schema, its result went back to the model, the run finished.
//
// Every tool schema the frameworks send is recorded as the server receives it (the request
// bodies, through the clients' fetch) and must be in tests/data/schemas/frameworks.jsonl, the
// schema corpus; the run writes what it saw to SWIFTLET_ARTIFACTS/frameworks.jsonl.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, oracles } from './helpers.mjs';

const { OpenAI } = oracles('openai');
const Ajv = oracles('ajv').default;
const { z } = oracles('zod');
const ai = oracles('ai');
const { createOpenAICompatible } = oracles('@ai-sdk/openai-compatible');
const agents = oracles('@openai/agents');
const { Client: McpClient } = oracles('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = oracles('@modelcontextprotocol/sdk/client/stdio.js');

const MODEL = 'toy';
const CORPUS = 'tests/data/schemas/frameworks.jsonl';
const ajv = new Ajv({ strict: false });

// Request bodies by framework, captured on their way to the server.
const sent = new Map();
function capturingFetch(framework) {
  if (!sent.has(framework)) sent.set(framework, []);
  return async (url, init) => {
    if (init?.body && String(url).includes('/chat/completions')) sent.get(framework).push(JSON.parse(init.body));
    return fetch(url, init);
  };
}
const schemasOf = (body) => (body.tools ?? []).map((t) => t.function.parameters);

function validateArgs(schema, args) {
  const v = ajv.compile(schema);
  assert.ok(v(args), `${JSON.stringify(args)}: ${ajv.errorsText(v.errors)}`);
}

// The request after the one that produced the call carries the tool's result under its id.
function assertResultWentBack(bodies, callId, resultText) {
  const later = bodies.find((b) => b.messages.some((m) => m.role === 'tool' && m.tool_call_id === callId));
  assert.ok(later, `no request carried the result of call ${callId}`);
  const m = later.messages.find((x) => x.role === 'tool' && x.tool_call_id === callId);
  const content = typeof m.content === 'string' ? m.content : JSON.stringify(m.content);
  assert.ok(content.includes(resultText), `the tool message holds ${content}`);
}

let server;
before(async () => {
  server = await startServer({ model: 'models/toy.qpack', args: ['--ctx', '4096'] });
  agents.setTracingDisabled(true);  // traces would go to OpenAI's servers
});
after(async () => {
  // The schemas seen, one a line, for the corpus.
  const seen = new Set();
  for (const bodies of sent.values()) for (const b of bodies) for (const s of schemasOf(b)) seen.add(JSON.stringify(s));
  const dir = process.env.SWIFTLET_ARTIFACTS || os.tmpdir();
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, 'frameworks.jsonl'), [...seen].sort().join('\n') + '\n');
  if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null });
});

describe('Vercel AI SDK', () => {
  test('streamText: a forced call streamed in fragments, its result back, a second step answers', async () => {
    const provider = createOpenAICompatible({
      name: 'swiftlet', baseURL: server.base + '/v1', apiKey: 'none', fetch: capturingFetch('ai-sdk'),
    });
    const executed = [];
    const result = ai.streamText({
      model: provider.chatModel(MODEL),
      prompt: 'What is the weather in Paris?',
      tools: {
        get_weather: ai.tool({
          description: 'Current weather in a city',
          inputSchema: z.object({
            city: z.string().min(4).max(8).describe('The city'),
            unit: z.enum(['celsius', 'fahrenheit']),
          }),
          execute: async ({ city, unit }) => {
            executed.push({ city, unit });
            return { city, temperature: 21, unit, sky: 'clear' };
          },
        }),
      },
      prepareStep: ({ stepNumber }) =>
        stepNumber === 0 ? { toolChoice: { type: 'tool', toolName: 'get_weather' } } : { toolChoice: 'none' },
      stopWhen: ai.stepCountIs(4),
      maxOutputTokens: 160,  // room for the forced call: constrained, it took 84 tokens here
      temperature: 0,
      maxRetries: 0,
    });
    let inputDeltas = 0;
    for await (const part of result.fullStream) {
      if (part.type === 'error') throw part.error;
      if (part.type === 'tool-input-delta') ++inputDeltas;
    }
    const steps = await result.steps;
    assert.equal(steps.length, 2, 'a tool step, then an answer');
    assert.equal(steps[0].finishReason, 'tool-calls');
    assert.equal(steps[0].toolCalls.length, 1);
    const call = steps[0].toolCalls[0];
    assert.equal(call.toolName, 'get_weather');
    const bodies = sent.get('ai-sdk');
    validateArgs(schemasOf(bodies[0])[0], call.input);
    assert.deepEqual(executed, [call.input]);
    assert.equal(steps[0].toolResults[0].output.temperature, 21);
    assert.ok(inputDeltas > 1, `the arguments came in ${inputDeltas} delta(s)`);
    assertResultWentBack(bodies, call.toolCallId, '"sky":"clear"');
    assert.notEqual(steps[1].finishReason, 'tool-calls');
    assert.equal(steps[1].toolCalls.length, 0);
  });

  test('generateText with zod bounds (minimum, pattern, format)', async () => {
      const provider = createOpenAICompatible({
        name: 'swiftlet', baseURL: server.base + '/v1', apiKey: 'none', fetch: capturingFetch('ai-sdk-bounds'),
      });
      const booked = [];
      const r = await ai.generateText({
        model: provider.chatModel(MODEL),
        prompt: 'Book a table for two tomorrow.',
        tools: {
          book_table: ai.tool({
            description: 'Book a table',
            inputSchema: z.object({
              guests: z.number().int().min(1).max(12),
              date: z.iso.date(),
              email: z.email(),
              code: z.string().regex(/^[A-Z]{3}$/),
            }),
            execute: async (input) => { booked.push(input); return 'booked'; },
          }),
          // Offered, not called: more of what zod writes (unions, tuples, records, defaults).
          find_slot: ai.tool({
            description: 'Find a free slot',
            inputSchema: z.object({
              id: z.uuid(),
              at: z.iso.datetime(),
              site: z.url().optional(),
              party: z.union([z.number().int().positive(), z.literal('large')]),
              seating: z.discriminatedUnion('kind', [
                z.object({ kind: z.literal('inside'), floor: z.number().int().nonnegative() }),
                z.object({ kind: z.literal('outside'), heated: z.boolean().default(true) }),
              ]),
              window: z.tuple([z.string(), z.string()]).nullable(),
              tags: z.array(z.string().min(1)).min(1).max(5),
              prefs: z.record(z.string(), z.boolean()),
              budget: z.number().multipleOf(5).lte(500),
            }),
          }),
        },
        toolChoice: 'required',
        stopWhen: ai.stepCountIs(1),
        maxOutputTokens: 160,
        temperature: 0,
        maxRetries: 0,
      });
      assert.equal(r.steps[0].toolCalls.length, 1);
      validateArgs(schemasOf(sent.get('ai-sdk-bounds')[0])[0], r.steps[0].toolCalls[0].input);
      assert.equal(booked.length, 1);
    });
});

describe('OpenAI Agents SDK', () => {
  test('run(): a forced tool call, its output back to the model, a final answer (streamed)', async () => {
    const client = new OpenAI({
      baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000, fetch: capturingFetch('openai-agents'),
    });
    const executed = [];
    const getWeather = agents.tool({
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: z.object({ city: z.string().max(12), days: z.array(z.string().max(8)).max(2) }),
      execute: async ({ city, days }) => {
        executed.push({ city, days });
        return `21 degrees and clear in ${city}`;
      },
    });
    const agent = new agents.Agent({
      name: 'Forecaster',
      instructions: 'Answer weather questions with the get_weather tool.',
      model: new agents.OpenAIChatCompletionsModel(client, MODEL),
      tools: [getWeather],
      // Forced on the first turn; the SDK resets the choice once a tool was used (resetToolChoice).
      modelSettings: { toolChoice: 'get_weather', temperature: 0, maxTokens: 160 },
    });
    const result = await agents.run(agent, 'What is the weather in Paris?', { maxTurns: 3, stream: true });
    let argDeltas = 0;
    for await (const ev of result) {
      if (ev.type === 'raw_model_stream_event' && ev.data?.type === 'model' &&
          ev.data.event?.choices?.[0]?.delta?.tool_calls) ++argDeltas;
    }
    await result.completed;
    assert.equal(result.error ?? null, null);
    const calls = result.newItems.filter((i) => i.type === 'tool_call_item');
    const outputs = result.newItems.filter((i) => i.type === 'tool_call_output_item');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].rawItem.name, 'get_weather');
    const bodies = sent.get('openai-agents');
    validateArgs(schemasOf(bodies[0])[0], JSON.parse(calls[0].rawItem.arguments));
    assert.equal(executed.length, 1);
    assert.equal(outputs.length, 1);
    assertResultWentBack(bodies, calls[0].rawItem.callId, '21 degrees and clear');
    assert.equal(typeof result.finalOutput, 'string');
    assert.equal(bodies.length, 2, 'a call, then the answer');
    assert.ok(argDeltas > 1, `the call came in ${argDeltas} delta(s)`);
  });
});

describe('OpenAI Agents SDK, zod bounds', () => {
  test('run(): a tool whose schema has minimum, pattern and format', async () => {
      const client = new OpenAI({
        baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000, fetch: capturingFetch('openai-agents-bounds'),
      });
      const calls = [];
      const remind = agents.tool({
        name: 'set_reminder',
        description: 'Set a reminder',
        parameters: z.object({
          minutes: z.number().int().min(1).max(600),
          text: z.string().max(20),
          email: z.email().nullable(),
          repeat: z.enum(['never', 'daily', 'weekly']),
          at: z.iso.time().nullable(),
        }),
        execute: async (input) => { calls.push(input); return 'set'; },
      });
      const agent = new agents.Agent({
        name: 'Reminder', instructions: 'Set reminders with the tool.', tools: [remind],
        model: new agents.OpenAIChatCompletionsModel(client, MODEL),
        modelSettings: { toolChoice: 'required', temperature: 0, maxTokens: 160 },
      });
      const result = await agents.run(agent, 'Remind me in ten minutes to call Anna.', { maxTurns: 3 });
      assert.equal(calls.length, 1);
      assert.equal(typeof result.finalOutput, 'string');
    });
});

describe('MCP server (server-memory over stdio)', () => {
  let mcp;
  let dir;
  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'swiftlet-mcp-'));
    mcp = new McpClient({ name: 'swiftlet-test', version: '1.0.0' });
    await mcp.connect(new StdioClientTransport({
      command: process.execPath,
      args: [oracles.resolve('@modelcontextprotocol/server-memory/dist/index.js')],
      env: { MEMORY_FILE_PATH: path.join(dir, 'memory.jsonl') },
      stderr: 'pipe',
    }));
  });
  after(async () => {
    await mcp?.close();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('tools/list feeds an agent loop: a forced call runs on the MCP server, its result goes back', async () => {
    const { tools } = await mcp.listTools();
    assert.ok(tools.length >= 5);
    const client = new OpenAI({
      baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000, fetch: capturingFetch('mcp-memory'),
    });
    const openaiTools = tools.map((t) => ({
      type: 'function', function: { name: t.name, description: t.description, parameters: t.inputSchema },
    }));
    const messages = [
      { role: 'system', content: 'You keep a knowledge graph with the tools you have.' },
      { role: 'user', content: 'Remember that Paris is a city in France.' },
    ];
    const results = [];
    for (let step = 0; step < 3; ++step) {
      const r = await client.chat.completions.create({
        model: MODEL, messages, tools: openaiTools, temperature: 0, max_tokens: 200,
        tool_choice: step === 0 ? { type: 'function', function: { name: 'create_entities' } } : 'none',
      });
      const msg = r.choices[0].message;
      messages.push({ role: 'assistant', content: msg.content, ...(msg.tool_calls ? { tool_calls: msg.tool_calls } : {}) });
      if (!msg.tool_calls) break;
      assert.equal(r.choices[0].finish_reason, 'tool_calls');
      for (const call of msg.tool_calls) {
        const args = JSON.parse(call.function.arguments);
        validateArgs(tools.find((t) => t.name === call.function.name).inputSchema, args);
        const res = await mcp.callTool({ name: call.function.name, arguments: args });
        assert.ok(!res.isError, JSON.stringify(res.content));
        const text = res.content.map((c) => c.text).join('\n');
        results.push({ call, args, text });
        messages.push({ role: 'tool', tool_call_id: call.id, content: text });
      }
    }
    assert.equal(results.length, 1, 'one forced call, then an answer');
    assert.equal(results[0].call.function.name, 'create_entities');
    assert.ok(!messages.at(-1).tool_calls, 'the loop finished with an answer');
    assertResultWentBack(sent.get('mcp-memory'), results[0].call.id, results[0].text);
    // The call really ran: the graph holds what it created.
    const graph = JSON.parse((await mcp.callTool({ name: 'read_graph', arguments: {} })).content[0].text);
    const names = new Set(results[0].args.entities.map((e) => e.name));
    assert.deepEqual(new Set(graph.entities.map((e) => e.name)), names);
  });
});

test('every schema the frameworks sent is in the schema corpus', () => {
  const corpus = new Set(readFileSync(CORPUS, 'utf8').split('\n').filter(Boolean).map((l) => JSON.stringify(JSON.parse(l))));
  const missing = new Set();
  for (const [framework, bodies] of sent)
    for (const b of bodies) for (const s of schemasOf(b)) if (!corpus.has(JSON.stringify(s))) missing.add(`${framework}: ${JSON.stringify(s)}`);
  assert.deepEqual([...missing], [], `add these to ${CORPUS} (the run wrote them all to SWIFTLET_ARTIFACTS/frameworks.jsonl)`);
});

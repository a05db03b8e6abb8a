// Runs protocol/vectors/*.jsonl cases through the client (see vectors/README.md).
//
// A case whose request is an object with a string op and a valid id goes
// through the public API (request, or stream for a streamed generate): the
// client replaces the id with its own, and every line must carry that one.
// Every other case (no id or a null one, whose lines must carry null; lines a
// well-behaved client never writes: not JSON, not an object, no op, an id of
// another type, invalid UTF-8) goes through the client's private exchange,
// verbatim.
import fs from 'node:fs';
import path from 'node:path';
import { ReflexError } from '../index.js';
import { vectorsDir } from './helpers.js';

export function vectorFiles() {
  if (!fs.existsSync(vectorsDir)) return [];
  return fs.readdirSync(vectorsDir).filter((f) => f.endsWith('.jsonl')).sort().map((f) => path.join(vectorsDir, f));
}

// The cases of a file, a request's "model": "$MODEL" replaced with `model`: the model
// under test (the server's default model's path; see modelUnderTest).
export function loadCases(file, model) {
  const cases = fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
  for (const c of cases) {
    const r = c.request;
    if (r && typeof r === 'object' && r.model === '$MODEL') r.model = model;
  }
  return cases;
}

/** The path of the server's default model: what "$MODEL" stands for in a case. */
export async function modelUnderTest(client) {
  return (await client.load({})).path;
}

// An id the server echoes: a string or an integer in [-2^63, 2^63).
const validId = (v) => typeof v === 'string' || (Number.isInteger(v) && v >= -(2 ** 63) && v < 2 ** 63);

export function jsonEqual(a, b) {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  }
  if (a && b && typeof a === 'object' && typeof b === 'object') {
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return jsonEqual(ka, kb) && ka.every((k) => jsonEqual(a[k], b[k]));
  }
  return a === b;
}

const MISSING = Symbol('missing');
function dotted(obj, key) {
  for (const part of key.split('.')) {
    if (obj === null || typeof obj !== 'object' || !(part in obj)) return MISSING;
    obj = obj[part];
  }
  return obj;
}

async function collect(iter, events) {
  try {
    for await (const ev of iter) events.push(ev);
  } catch (e) {
    if (!(e instanceof ReflexError) || !e.response) throw e;
    events.push(e.response);
  }
}

/** Sends the case, checks the response; returns a list of problems (empty: pass). */
export async function runCase(client, c) {
  const req = c.request;
  const exp = c.expect;
  const events = [];
  let wantId;
  if (req && typeof req === 'object' && !Array.isArray(req) && typeof req.op === 'string' && validId(req.id)) {
    const { id: _id, op, ...params } = req;
    const iter = op === 'generate' && params.stream === true
      ? client.stream(params) : client._events(op, params);
    await collect(iter, events);
    wantId = jsonEqual('id' in exp ? exp.id : req.id, req.id) ? client._nextId : exp.id;
  } else {
    let line;
    if ('request_base64' in c) line = Buffer.from(c.request_base64, 'base64');
    else if (typeof req === 'string') line = Buffer.from(req, 'utf8');
    else line = Buffer.from(JSON.stringify(req), 'utf8');
    const own = req && typeof req === 'object' && !Array.isArray(req) && validId(req.id) ? req.id : null;
    wantId = 'id' in exp ? exp.id : own;
    await collect(client._exchange(() => [Buffer.concat([line, Buffer.from('\n')]), wantId], 'raw'), events);
  }
  return check(events, exp, wantId);
}

function check(events, exp, wantId) {
  const bad = [];
  const result = events[events.length - 1];
  const tokens = events.slice(0, -1);
  for (const ev of events) if (!jsonEqual(ev.id, wantId)) bad.push(`line with id ${JSON.stringify(ev.id)}, want ${JSON.stringify(wantId)}`);
  for (const ev of tokens) {
    if (ev.event !== 'token' || !Number.isInteger(ev.token_id) || typeof ev.text !== 'string') bad.push(`not a token line: ${JSON.stringify(ev)}`);
  }
  if (result.event !== 'result') bad.push(`last line is not a result: ${JSON.stringify(result)}`);
  if (result.ok !== exp.ok) bad.push(`ok is ${result.ok}, want ${exp.ok}: ${JSON.stringify(result).slice(0, 300)}`);
  if ('error_kind' in exp && result.error?.kind !== exp.error_kind) bad.push(`error kind ${result.error?.kind}, want ${exp.error_kind}`);
  if ('message_contains' in exp && !(result.error?.message ?? '').includes(exp.message_contains)) {
    bad.push(`error message ${JSON.stringify(result.error?.message)} lacks ${JSON.stringify(exp.message_contains)}`);
  }
  for (const key of exp.fields ?? []) if (dotted(result, key) === MISSING) bad.push(`result lacks ${key}`);
  for (const [key, value] of Object.entries(exp.values ?? {})) {
    const got = dotted(result, key);
    if (got === MISSING || !jsonEqual(got, value)) bad.push(`${key} is ${JSON.stringify(got)}, want ${JSON.stringify(value)}`);
  }
  if (exp.tokens === true && (tokens.length === 0 || tokens.map((t) => t.text).join('') !== result.text)) {
    bad.push(`token lines ${JSON.stringify(tokens.map((t) => t.text))} do not spell the text ${JSON.stringify(result.text)}`);
  }
  if (exp.tokens === false && tokens.length) bad.push(`${tokens.length} token lines, want none`);
  for (const key of ['timings.total', 'timings.parse']) {
    if (typeof dotted(result, key) !== 'number') bad.push(`${key} is not a number`);
  }
  if (!('op' in result) || !(result.op === null || typeof result.op === 'string')) bad.push('op is not a string or null');
  return bad;
}

// The client against the real server (`reflex stdio`, or $REFLEX_CMD).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Reflex, ReflexError } from '../index.js';
import { reflexCommand } from './helpers.js';
import { vectorFiles, loadCases, modelUnderTest, runCase } from './vectors.js';

const LONG = { prompt: 'Once upon a time, in a land far away,', max_tokens: 256, temperature: 0 };
let c;
before(async () => { c = await Reflex.spawn(reflexCommand()); });
after(async () => { await c?.close(); });

const rejectsKind = (promise, kind, pattern) => assert.rejects(promise, (e) => {
  assert.ok(e instanceof ReflexError, String(e));
  assert.equal(e.kind, kind, e.message);
  if (pattern) assert.match(e.message, pattern);
  return true;
});

test('protocol/vectors has cases', () => {
  assert.ok(vectorFiles().length > 0, 'protocol/vectors/*.jsonl: no conformance cases found');
});

for (const file of vectorFiles()) {
  test(`vectors: ${path.basename(file)}`, async () => {
    const failures = {};
    for (const kase of loadCases(file, await modelUnderTest(c))) {
      const bad = await runCase(c, kase);
      if (bad.length) failures[kase.name] = bad;
    }
    assert.deepEqual(failures, {});
  });
}

test('generate equals the concatenated stream', async () => {
  const r = await c.generate({ prompt: 'The capital of France is', max_tokens: 6 });
  const events = [];
  for await (const ev of c.stream({ prompt: 'The capital of France is', max_tokens: 6 })) events.push(ev);
  const result = events.pop();
  assert.equal(result.event, 'result');
  assert.ok(events.every((e) => e.event === 'token'));
  assert.equal(events.map((e) => e.text).join(''), r.text);
  assert.deepEqual(events.map((e) => e.token_id), r.token_ids);
});

test('the other ops', async () => {
  const { token_ids } = await c.tokenize({ text: 'Hello world' });
  assert.equal((await c.detokenize({ token_ids })).text, 'Hello world');
  const sp = await c.tokenize({ text: 'Hello <|im_end|>' });
  assert.equal((await c.detokenize({ token_ids: sp.token_ids, special: true })).text, 'Hello <|im_end|>');
  const s = await c.system1({ prompt: 'Is the sky blue? Answer:', candidates: [' yes', ' no'] });
  assert.equal(s.candidates.length, 2);
  const e = await c.embed({ input: ['a', 'b'] });
  assert.equal(e.embeddings.length, 2);
  assert.equal(e.embeddings[0].length, e.dim);
});

test('classify', async () => {
  // cache_prompt false: both evaluate the whole prompt in one pass, so the two agree exactly
  // whatever batch shapes the backend's kernels are sensitive to (ARCHITECTURE.md, "Batch-invariant")
  const r = await c.classify({ input: 'Is the sky blue? Answer:', labels: [' yes', ' no'], cache_prompt: false });
  const s = await c.system1({ prompt: 'Is the sky blue? Answer:', candidates: [' yes', ' no'], cache_prompt: false });
  assert.equal(r.best, [' yes', ' no'][s.best_idx]);
  r.labels.forEach((l, i) => assert.ok(Math.abs(l.probability - s.candidates[i].probability) < 1e-9));
  assert.equal(r.warning, undefined);
  const capital = [{ role: 'user', content: 'What is the capital of France?' }];
  assert.equal((await c.classify({ messages: capital, labels: ['Paris', 'London', 'Berlin'] })).best, 'Paris');
  const batch = await c.classify({ messages: [{ role: 'user', content: 'Water is wet. '.repeat(8) }],
    labels: ['yes', 'no', 'not sure'], questions: ['Is water wet?', 'Is water dry?'] });
  assert.deepEqual(batch.results.map((x) => x.question), ['Is water wet?', 'Is water dry?']);
  assert.match(batch.warning, /different lengths/);
  assert.ok(batch.results[1].cached_tokens > 0);
  await rejectsKind(c.classify({ input: 'x', labels: [' a', ' a'] }), 'invalid_request');
});

test('chat, infill, logprobs, json_schema', async () => {
  const capital = [{ role: 'user', content: 'How many days are in a week?' }];
  const r = await c.chat(capital, { max_tokens: 24 });
  assert.match(r.text, /\b7\b/);
  assert.equal(r.finish_reason, 'stop');
  let streamed = '';
  for await (const ev of c.streamChat(capital, { max_tokens: 24 })) if (ev.event === 'token') streamed += ev.text;
  assert.equal(streamed, r.text);
  const t = await c.tokenize({ messages: capital });
  assert.ok(t.prompt.endsWith('<|im_start|>assistant\n'));
  assert.equal(t.token_ids.length, r.prompt_tokens);
  await rejectsKind(c.infill({ prefix: 'def f(', suffix: ')' }), 'invalid_request', /fill-in-the-middle/);
  const lp = await c.chat(capital, { max_tokens: 3, logprobs: 2 });
  assert.equal(lp.logprobs.length, 3);
  assert.equal(lp.logprobs[0].top.length, 2);
  const schema = { type: 'object', properties: { city: { type: 'string', maxLength: 20 } }, required: ['city'], additionalProperties: false };
  const js = await c.chat(capital, { json_schema: schema, max_tokens: 40 });
  assert.equal(js.finish_reason, 'stop');
  assert.equal(typeof JSON.parse(js.text).city, 'string');
  await rejectsKind(c.chat(capital, { json_schema: { type: 'nope' } }), 'invalid_request', /json_schema/);
});

test('prefix_cache: false passes through (the prefix cache is neither read nor written)', async () => {
  const long = 'word '.repeat(200);
  const g = await c.generate({ prompt: long, max_tokens: 1, prefix_cache: false });
  assert.equal(g.timings.prefix_cache_tokens, undefined);
  const s = await c.system1({ prompt: long, candidates: [' a', ' b'], prefix_cache: false });
  assert.equal(s.timings.prefix_cache_tokens, undefined);
});

test('sampling fields, n choices, thinking budget', async () => {
  const prompt = 'The capital of France is';
  const plain = await c.generate({ prompt, max_tokens: 6 });
  const r = await c.generate({ prompt, max_tokens: 6, frequency_penalty: 1.0, presence_penalty: 0.5,
    logit_bias: { [String(plain.token_ids[0])]: -100 }, dry_multiplier: 0.8, typical_p: 0.95 });
  assert.notEqual(r.token_ids[0], plain.token_ids[0]);
  const n = await c.generate({ prompt, max_tokens: 3, n: 2, temperature: 0.8, seed: 1 });
  assert.deepEqual(n.choices.map((x) => x.index), [0, 1]);
  assert.equal(n.text, n.choices[0].text);
  await rejectsKind(c.chat([{ role: 'user', content: 'Hi' }], { thinking_budget: 4, enable_thinking: true, max_tokens: 2 }),
    'invalid_request', /<think>/);
});

test('saved state: kv_export, kv_import, stateSave, stateLoad', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'reflex-state-'));
  try {
    const p = path.join(dir, 'p.state');
    const full = await c.generate({ prompt: 'The capital of France is Paris. The capital of Italy is', max_tokens: 4 });
    const a = await c.generate({ prompt: 'The capital of France is Paris.', max_tokens: 1, kv_export: p });
    assert.equal(a.kv_export.n_tokens, a.prompt_tokens);
    const b = await c.generate({ prompt: ' The capital of Italy is', max_tokens: 4, kv_import: p });
    assert.equal(b.cached_tokens, a.prompt_tokens);
    assert.deepEqual(b.token_ids, full.token_ids);
    const saved = await c.stateSave({ path: path.join(dir, 'q.state') });
    assert.ok(saved.n_tokens > 0 && saved.bytes > 0);
    assert.equal((await c.stateLoad({ path: p })).n_tokens, a.prompt_tokens);
    await rejectsKind(c.stateLoad({ path: path.join(dir, 'missing.state') }), 'state_error');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('errors carry the protocol kind', async () => {
  await rejectsKind(c.request('frobnicate'), 'unknown_op');
  await rejectsKind(c.generate({ prompt: 'x', max_tokens: 0 }), 'invalid_request', /max_tokens/);
  await rejectsKind(c.generate({ prompt: 'x', model: '/nonexistent/model.gguf' }), 'model_not_found');
  assert.equal((await c.ping()).ok, true);
});

test('cancel mid-stream: SIGINT, the server keeps serving', async () => {
  const pid = c.ready.pid;
  let n = 0;
  for await (const ev of c.stream(LONG)) {
    assert.equal(ev.event, 'token');
    if (++n === 2) break; // cancels and drains
  }
  const ac = new AbortController();
  const p = c.generate(LONG, { signal: ac.signal });
  setTimeout(() => ac.abort(), 500);
  await rejectsKind(p, 'cancelled');
  await rejectsKind(c.generate(LONG, { timeout: 500 }), 'cancelled', /timed out/);
  assert.equal((await c.generate({ prompt: 'Hi', max_tokens: 2 })).ok, true);
  assert.equal(c.ready.pid, pid);
});

test('a child killed from outside: a clear error, then a restart', async () => {
  const it = c.stream(LONG);
  assert.equal((await it.next()).value.event, 'token');
  const pid = c.ready.pid;
  process.kill(pid, 'SIGKILL');
  await rejectsKind((async () => { for await (const _ of it); })(), 'connection', /SIGKILL/);
  assert.equal((await c.ping()).ok, true);
  assert.notEqual(c.ready.pid, pid);
  const pid2 = c.ready.pid;
  process.kill(pid2, 'SIGKILL'); // while idle: replaced on the next call
  await new Promise((r) => setTimeout(r, 200));
  assert.equal((await c.ping()).ok, true);
  assert.notEqual(c.ready.pid, pid2);
});

test('uds: connect, stream, cancel by closing, reconnect', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'reflex-'));
  const sock = path.join(dir, 'reflex.sock');
  const { command, args } = reflexCommand();
  const i = args.lastIndexOf('stdio');
  const argv = i >= 0 ? [...args.slice(0, i), 'uds', sock, ...args.slice(i + 1)] : [...args, 'uds', sock];
  const server = spawn(command, argv, { stdio: ['ignore', 'inherit', 'inherit'] });
  const exited = new Promise((r) => server.on('exit', (code) => r(code)));
  try {
    const t0 = Date.now();
    while (!fs.existsSync(sock)) {
      assert.ok(Date.now() - t0 < 30000, 'reflex uds did not start');
      await new Promise((r) => setTimeout(r, 20));
    }
    const u = await Reflex.connect(sock);
    try {
      assert.equal(u.ready.pid, server.pid);
      const events = [];
      for await (const ev of u.stream({ prompt: 'Hello', max_tokens: 3 })) events.push(ev);
      assert.equal(events.at(-1).ok, true);
      for await (const _ of u.stream(LONG)) break; // closes the connection: the server cancels
      assert.equal((await u.generate({ prompt: 'Hi', max_tokens: 2 })).ok, true);
      await rejectsKind(u.generate(LONG, { timeout: 500 }), 'cancelled');
      assert.ok((await u.tokenize({ text: 'Hi' })).token_ids.length > 0);
    } finally { await u.close(); }
  } finally {
    server.kill('SIGTERM');
    assert.equal(await exited, 0);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

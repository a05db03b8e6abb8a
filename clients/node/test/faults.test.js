// Fault injection against the fake server (testdata/fake_server.py).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Reflex, ReflexError } from '../index.js';
import { fakeServer } from './helpers.js';

const fake = (mode = '', delay = '0.05', opts = {}) => Reflex.spawn({
  command: 'python3', args: [fakeServer],
  env: { ...process.env, FAKE_MODE: mode, FAKE_TOKEN_DELAY: delay }, ...opts,
});

const rejectsKind = async (promise, kind, pattern) => {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof ReflexError, String(e));
    assert.equal(e.kind, kind);
    if (pattern) assert.match(e.message, pattern);
    return true;
  });
};

test('ready timeout kills the child', async () => {
  const t0 = Date.now();
  await rejectsKind(fake('no_ready', '0.05', { readyTimeout: 500 }), 'connection', /no ready line/);
  assert.ok(Date.now() - t0 < 5000);
});

test('first line must be the ready event', async () => {
  await rejectsKind(fake('bad_ready'), 'connection', /not the ready event/);
});

test('a child that exits before ready: status and stderr in the error', async () => {
  await rejectsKind(fake('exit_early'), 'connection', /status 3[\s\S]*cannot start/);
});

test('a missing command', async () => {
  await rejectsKind(Reflex.spawn({ command: '/nonexistent/reflex' }), 'connection', /cannot start/);
});

test('a dead child is reported, then restarted on the next call', async () => {
  const c = await fake();
  try {
    const pid = c.ready.pid;
    await rejectsKind(c.request('die'), 'connection', /status 7/);
    assert.equal((await c.ping()).ok, true);
    assert.notEqual(c.ready.pid, pid);
  } finally { await c.close(); }
});

test('abort and timeout cancel with SIGINT; the child keeps serving', async () => {
  const c = await fake('', '0.2');
  try {
    const pid = c.ready.pid;
    await rejectsKind(c.generate({ prompt: 'abcdefghijklmnop' }, { timeout: 300 }), 'cancelled', /timed out/);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 300);
    await rejectsKind(c.generate({ prompt: 'abcdefghijklmnop' }, { signal: ac.signal }), 'cancelled');
    await rejectsKind(c.generate({ prompt: 'x' }, { signal: ac.signal }), 'cancelled', /before it was sent/);
    assert.equal((await c.generate({ prompt: 'ok' })).text, 'ok');
    assert.equal(c.ready.pid, pid);
  } finally { await c.close(); }
});

test('concurrent callers are served in FIFO order', async () => {
  const c = await fake('', '0.01');
  try {
    const order = [];
    await Promise.all([...Array(8).keys()].map((i) => c.generate({ prompt: `p${i}` }).then((r) => order.push(r.text))));
    assert.deepEqual(order, [...Array(8).keys()].map((i) => `p${i}`));
  } finally { await c.close(); }
});

test('a timeout or an abort also covers the wait in the queue', async () => {
  const c = await fake('', '0.1');
  try {
    const first = c.generate({ prompt: 'abcdefgh' });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    await Promise.all([
      rejectsKind(c.generate({ prompt: 'x' }, { timeout: 100 }), 'cancelled', /timed out.*while waiting/),
      rejectsKind(c.generate({ prompt: 'x' }, { signal: ac.signal }), 'cancelled', /aborted while waiting/),
    ]);
    assert.equal((await first).text, 'abcdefgh');
    assert.equal((await c.generate({ prompt: 'ok' })).text, 'ok');
  } finally { await c.close(); }
});

test('a closed client refuses', async () => {
  const c = await fake();
  await c.close();
  await rejectsKind(c.ping(), 'connection', /closed/);
});

test('close kills a child that ignores stdin EOF', async () => {
  const c = await Reflex.spawn({
    command: 'sh',
    args: ['-c', 'echo \'{"event":"ready","id":null,"protocol":1}\'; trap "" INT; exec sleep 60'],
    closeTimeout: 500,
  });
  const t0 = Date.now();
  await c.close();
  assert.ok(Date.now() - t0 < 5000);
});

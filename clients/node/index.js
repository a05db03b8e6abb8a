// Thin, dependency-free client for the reflex protocol (protocol/PROTOCOL.md).
import { spawn as spawnChild } from 'node:child_process';
import net from 'node:net';

export const PROTOCOL = 1;

/** An error result of the protocol; `.kind` is the protocol's error kind.
 *  Client-side failures (server not started, gone, unreachable) have kind "connection". */
export class ReflexError extends Error {
  constructor(kind, message, response = null, options = undefined) {
    super(`${kind}: ${message}`, options);
    this.name = 'ReflexError';
    this.kind = kind;
    this.response = response;
  }
}

const RESIGNAL_MS = 250;

const connectionError = (message) => new ReflexError('connection', message);

// One transport: a spawned child (stdin/stdout) or a Unix socket connection.
class Conn {
  constructor(where) {
    this.where = where;
    this.dead = false;
    this.deathReason = null;
    this.ready = null;
    this._events = [];
    this._waiter = null;
    this._parts = [];
  }

  _attach(readable) {
    readable.setEncoding('utf8');
    readable.on('data', (chunk) => {
      // Only the new chunk is searched for newlines: long lines (embeddings) stay linear.
      let start = 0;
      let nl;
      while ((nl = chunk.indexOf('\n', start)) >= 0) {
        this._parts.push(chunk.slice(start, nl));
        const line = this._parts.join('');
        this._parts = [];
        start = nl + 1;
        if (line.trim() !== '') this._push(parseLine(line));
      }
      if (start < chunk.length) this._parts.push(chunk.slice(start));
    });
  }

  _push(item) {
    if (this._waiter) {
      const w = this._waiter;
      this._waiter = null;
      w(item);
    } else this._events.push(item);
  }

  _die(reason) {
    if (this.dead && this.deathReason) return;
    this.dead = true;
    this.deathReason = reason;
    this._push(connectionError(reason));
  }

  /** The next server event; rejects with a "connection" ReflexError once the server is gone. */
  next() {
    const take = (item) => {
      if (item instanceof Error) {
        this._events.unshift(item); // stays dead for every later reader
        throw item;
      }
      return item;
    };
    if (this._events.length) return Promise.resolve().then(() => take(this._events.shift()));
    return new Promise((resolve) => { this._waiter = resolve; }).then(take);
  }
}

class ChildConn extends Conn {
  constructor({ command, args, env, cwd, stderr }) {
    super(`${command} ${args.join(' ')}`.trim());
    this._stderrTail = [];
    const child = spawnChild(command, args, { env, cwd, stdio: ['pipe', 'pipe', stderr] });
    this.child = child;
    this.where = `${this.where} (pid ${child.pid})`;
    child.stdin.on('error', () => {}); // EPIPE when the child is gone: reported by 'close'
    this._attach(child.stdout);
    if (child.stderr) {
      child.stderr.setEncoding('utf8');
      child.stderr.on('data', (s) => {
        this._stderrTail.push(...s.split('\n').filter(Boolean));
        if (this._stderrTail.length > 40) this._stderrTail.splice(0, this._stderrTail.length - 40);
      });
    }
    child.on('error', (e) => this._die(`cannot start ${command}: ${e.message}`));
    child.on('close', (code, signal) => {
      const what = signal ? `was killed by ${signal}` : `exited with status ${code}`;
      const tail = this._stderrTail.join('\n');
      this._die(`${this.where}: the server ${what}${tail ? `; stderr:\n${tail}` : ''}`);
    });
  }

  send(line) { this.child.stdin.write(line); }

  interrupt() { if (!this.dead) this.child.kill('SIGINT'); }

  abandon() { if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL'); }

  async close(graceMs) {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.stdin.end(); // stdin EOF: the server finishes and exits 0
    let timer;
    const late = new Promise((resolve) => { timer = setTimeout(() => resolve('late'), graceMs); });
    if ((await Promise.race([exited, late])) === 'late') {
      this.child.kill('SIGKILL');
      await exited;
    }
    clearTimeout(timer);
  }
}

class SocketConn extends Conn {
  constructor(path) {
    super(`uds ${path}`);
    this.sock = net.createConnection(path);
    this._attach(this.sock);
    this.sock.on('error', (e) => this._die(`${this.where}: ${e.message}`));
    this.sock.on('close', () => this._die(`${this.where}: connection closed by the server`));
  }

  send(line) { this.sock.write(line); }

  // The server cancels the request of a client that disconnects.
  interrupt() { this.abandon(); }

  abandon() { this.dead = true; this.sock.destroy(); }

  async close() { this.abandon(); }
}

function parseLine(line) {
  let obj;
  try { obj = JSON.parse(line); } catch {
    return connectionError(`server wrote a line that is not JSON: ${line.slice(0, 200)}`);
  }
  if (obj === null || typeof obj !== 'object' || !('event' in obj)) {
    return connectionError(`server wrote a line that is not an event: ${line.slice(0, 200)}`);
  }
  return obj;
}

async function waitReady(conn, timeoutMs) {
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(connectionError(`${conn.where}: no ready line within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    const ev = await Promise.race([conn.next(), late]);
    if (ev.event !== 'ready') throw connectionError(`${conn.where}: first line is not the ready event: ${JSON.stringify(ev).slice(0, 200)}`);
    if (ev.protocol !== PROTOCOL) throw connectionError(`${conn.where}: server speaks protocol ${ev.protocol}, this client speaks ${PROTOCOL}`);
    conn.ready = ev;
    return conn;
  } catch (e) {
    conn.abandon();
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

// A result whose id is null answers the one request in flight (line_too_long cannot echo it).
const endsRequest = (ev, rid) => ev.event === 'result' && (ev.id === rid || ev.id === null || ev.id === undefined);

export class Reflex {
  constructor(open, { closeTimeout = 5000, cancelTimeout = 10000 } = {}) {
    this._open = open;
    this._closeTimeout = closeTimeout;
    this._cancelTimeout = cancelTimeout;
    this._conn = null;
    this._closed = false;
    this._nextId = 0;
    this._busy = false;
    this._queue = []; // FIFO of callers waiting for the connection
  }

  /** Spawn a server speaking the protocol on stdio and wait for its ready line. */
  static async spawn({ command = 'reflex', args = ['stdio'], env, cwd, stderr = 'pipe',
    readyTimeout = 60000, closeTimeout = 5000, cancelTimeout = 10000 } = {}) {
    const open = () => waitReady(new ChildConn({ command, args, env, cwd, stderr }), readyTimeout);
    const client = new Reflex(open, { closeTimeout, cancelTimeout });
    client._conn = await open();
    return client;
  }

  /** Connect to `reflex uds PATH` and wait for the connection's ready line. */
  static async connect(path, { readyTimeout = 60000, cancelTimeout = 10000 } = {}) {
    const open = () => waitReady(new SocketConn(path), readyTimeout);
    const client = new Reflex(open, { cancelTimeout });
    client._conn = await open();
    return client;
  }

  /** The ready event of the current connection. */
  get ready() { return this._conn ? this._conn.ready : null; }

  /** One request; resolves with its result (ok: true), rejects with a ReflexError. */
  async request(op, params = {}, { signal, timeout } = {}) {
    let result;
    for await (const ev of this._events(op, params, signal, timeout)) result = ev;
    return result;
  }

  /** generate with stream: true; yields token events, then the result. Breaking out cancels. */
  stream(params = {}, { signal, timeout } = {}) {
    return this._events('generate', { ...params, stream: true }, signal, timeout);
  }

  generate(params, opts) { return this.request('generate', params, opts); }
  /** generate on a conversation: messages rendered with the model's chat template. */
  chat(messages, params = {}, opts) { return this.request('generate', { ...params, messages }, opts); }
  /** chat with stream: true. */
  streamChat(messages, params = {}, opts = {}) { return this.stream({ ...params, messages }, opts); }
  /** Fill in the middle between prefix and suffix (models with FIM tokens). */
  infill(params, opts) { return this.request('infill', params, opts); }
  /** infill with stream: true. */
  streamInfill(params = {}, { signal, timeout } = {}) {
    return this._events('infill', { ...params, stream: true }, signal, timeout);
  }
  system1(params, opts) { return this.request('system1', params, opts); }
  /** The classify op: which of params.labels continues params.input (or begins the reply to params.messages). */
  classify(params, opts) { return this.request('classify', params, opts); }
  embed(params, opts) { return this.request('embed', params, opts); }
  tokenize(params, opts) { return this.request('tokenize', params, opts); }
  detokenize(params, opts) { return this.request('detokenize', params, opts); }
  stateSave(params, opts) { return this.request('state_save', params, opts); }
  stateLoad(params, opts) { return this.request('state_load', params, opts); }
  hello(params, opts) { return this.request('hello', params, opts); }
  load(params, opts) { return this.request('load', params, opts); }
  ping(opts) { return this.request('ping', {}, opts); }

  /** stdin EOF, wait up to closeTimeout ms for the server to exit, then kill it. */
  async close() {
    this._closed = true;
    const conn = this._conn;
    this._conn = null;
    if (conn) await conn.close(this._closeTimeout);
  }

  _acquire(signal, why) {
    if (!this._busy) {
      this._busy = true;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const entry = { resolve, reject };
      this._queue.push(entry);
      signal.addEventListener('abort', () => {
        const i = this._queue.indexOf(entry);
        if (i >= 0) {
          this._queue.splice(i, 1);
          reject(new ReflexError('cancelled', `${why()} while waiting for the connection`, null, { cause: signal.reason }));
        }
      }, { once: true });
    });
  }

  _release() {
    const next = this._queue.shift();
    if (next) next.resolve();
    else this._busy = false;
  }

  _events(op, params, signal, timeout) {
    const { id: _id, op: _op, ...rest } = params ?? {};
    return this._exchange((rid) => [`${JSON.stringify({ id: rid, op, ...rest })}\n`, rid], op, signal, timeout);
  }

  // Sends lineFor(rid) -> [line, the id the response carries]; yields the
  // request's events, the result last (an error result throws).
  async *_exchange(lineFor, what, signal, timeout) {
    if (signal?.aborted) throw new ReflexError('cancelled', `${what} aborted before it was sent`, null, { cause: signal.reason });
    // One signal for the caller's and the timeout's cancellation, from the call on (queueing included).
    const local = new AbortController();
    let why = 'aborted';
    const onAbort = () => local.abort(signal.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    const timer = timeout ? setTimeout(() => { why = `timed out after ${timeout} ms`; local.abort(); }, timeout) : null;
    try {
      yield* this._exchangeLocked(lineFor, what, local.signal, () => `${what} ${why}`, signal);
    } finally {
      signal?.removeEventListener('abort', onAbort);
      clearTimeout(timer);
    }
  }

  async *_exchangeLocked(lineFor, what, cancelSignal, why, signal) {
    await this._acquire(cancelSignal, why);
    try {
      if (this._closed) throw connectionError('the client is closed');
      if (!this._conn || this._conn.dead) this._conn = await this._open();
      const conn = this._conn;
      if (cancelSignal.aborted) throw new ReflexError('cancelled', `${why()} before it was sent`, null, { cause: signal?.reason });
      const [line, rid] = lineFor(++this._nextId);
      conn.send(line);

      let cancelled = null;
      let resignal = null;
      let killTimer = null;
      const cancel = (why) => {
        if (cancelled) return;
        cancelled = why;
        conn.interrupt();
        // SIGINT again until the result comes: one that reached the server before it read
        // the request line was ignored (idle); a repeat can only hit the request being cancelled.
        resignal = setInterval(() => conn.interrupt(), RESIGNAL_MS);
        // A server that does not answer the cancellation in time is killed (and restarted next call).
        killTimer = setTimeout(() => conn.abandon(), this._cancelTimeout);
      };
      const onCancel = () => cancel(why());
      if (cancelSignal.aborted) onCancel();
      else cancelSignal.addEventListener('abort', onCancel, { once: true });
      let done = false;
      try {
        while (true) {
          let ev;
          try {
            ev = await conn.next();
          } catch (e) {
            done = true;
            if (cancelled) throw new ReflexError('cancelled', cancelled, null, { cause: signal?.reason });
            throw e;
          }
          if (endsRequest(ev, rid)) {
            done = true;
            if (cancelled) throw new ReflexError('cancelled', cancelled, ev, { cause: signal?.reason });
            if (!ev.ok) throw new ReflexError(ev.error?.kind ?? 'internal', ev.error?.message ?? '', ev);
            yield ev;
            return;
          }
          if (ev.id === rid && !cancelled) yield ev;
        }
      } finally {
        cancelSignal.removeEventListener('abort', onCancel);
        if (!done) {
          // The consumer stopped iterating early: cancel, then drain to the result.
          cancel(`${what} stopped by the consumer`);
          try {
            while (!endsRequest(await conn.next(), rid));
          } catch { /* the server is gone: the next call restarts it */ }
        }
        clearInterval(resignal);
        clearTimeout(killTimer);
      }
    } finally {
      this._release();
    }
  }
}

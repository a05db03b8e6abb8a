// Types for reflex-client (index.js). The wire format is protocol/PROTOCOL.md.

export declare const PROTOCOL: number;

/** The kinds of protocol error results, plus "connection" for client-side failures. */
export type ErrorKind =
  | 'parse_error' | 'invalid_request' | 'unknown_op' | 'line_too_long'
  | 'model_not_found' | 'gguf_error' | 'unsupported_architecture'
  | 'context_overflow' | 'out_of_memory' | 'cuda_error' | 'cancelled' | 'internal'
  | 'connection';

export declare class ReflexError extends Error {
  constructor(kind: ErrorKind | string, message: string, response?: ResultEvent | null, options?: { cause?: unknown });
  /** The protocol's error kind ("connection": the server could not be started, reached, or went away). */
  readonly kind: ErrorKind | string;
  /** The result line of the failed request, when the server sent one. */
  readonly response: ResultEvent | null;
}

export type Id = string | number | null;

export interface ReadyEvent {
  event: 'ready';
  id: null;
  protocol: number;
  version: string;
  pid: number;
  backend: string;
  model: string | null;
  [key: string]: unknown;
}

export interface TokenEvent {
  event: 'token';
  id: Id;
  token_id: number;
  text: string;
  [key: string]: unknown;
}

export interface ResultEvent {
  event: 'result';
  id: Id;
  op?: string;
  ok: boolean;
  error?: { kind: ErrorKind; message: string };
  [key: string]: unknown;
}

export type StreamEvent = TokenEvent | ResultEvent;

export interface GenerateParams {
  prompt: string;
  max_tokens?: number;
  temperature?: number;
  top_k?: number;
  top_p?: number;
  min_p?: number;
  seed?: number | null;
  repeat_penalty?: number;
  stop?: string[];
  [key: string]: unknown;
}

export interface GenerateResult extends ResultEvent {
  text: string;
  token_ids: number[];
  finish_reason: string;
}

export interface System1Params {
  prompt: string;
  candidates: string[];
  temperature?: number;
  [key: string]: unknown;
}

export interface System1Candidate {
  text: string;
  token_ids: number[];
  logprob: number;
  mean_logprob: number;
  probability: number;
}

export interface System1Result extends ResultEvent {
  candidates: System1Candidate[];
  best_idx: number;
  entropy: number;
}

export interface EmbedResult extends ResultEvent {
  embeddings: number[][];
  dim: number;
}

export interface TokenizeResult extends ResultEvent {
  token_ids: number[];
}

export interface DetokenizeResult extends ResultEvent {
  text: string;
}

export interface RequestOptions {
  /** Aborting sends SIGINT to a spawned server (a socket is closed); the call rejects with kind "cancelled". */
  signal?: AbortSignal;
  /** Milliseconds; when they run out the request is cancelled as by `signal`. */
  timeout?: number;
}

export interface SpawnOptions {
  /** Default "reflex". */
  command?: string;
  /** Default ["stdio"]. */
  args?: string[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** "pipe" (default) keeps the last lines for error messages; "inherit" or "ignore" as in child_process. */
  stderr?: 'pipe' | 'inherit' | 'ignore';
  /** Milliseconds to wait for the ready line (default 60000). */
  readyTimeout?: number;
  /** Milliseconds close() waits after stdin EOF before killing the server (default 5000). */
  closeTimeout?: number;
  /** Milliseconds a cancelled request may take to answer before the server is killed (default 10000). */
  cancelTimeout?: number;
}

export interface ConnectOptions {
  readyTimeout?: number;
  cancelTimeout?: number;
}

export declare class Reflex {
  /** Spawn a server speaking the protocol on stdio; resolves once its ready line has arrived. */
  static spawn(options?: SpawnOptions): Promise<Reflex>;
  /** Connect to `reflex uds PATH`; resolves once the connection's ready line has arrived. */
  static connect(path: string, options?: ConnectOptions): Promise<Reflex>;

  /** The ready event of the current connection (a restarted server has a new one). */
  readonly ready: ReadyEvent | null;

  /** Any op; resolves with the result (ok: true) or rejects with a ReflexError carrying the protocol kind. */
  request(op: string, params?: Record<string, unknown>, options?: RequestOptions): Promise<ResultEvent>;
  generate(params: GenerateParams, options?: RequestOptions): Promise<GenerateResult>;
  /** generate with stream: true: yields token events, then the result; breaking out of the loop cancels. */
  stream(params: GenerateParams, options?: RequestOptions): AsyncGenerator<StreamEvent, void, undefined>;
  system1(params: System1Params, options?: RequestOptions): Promise<System1Result>;
  embed(params: Record<string, unknown>, options?: RequestOptions): Promise<EmbedResult>;
  tokenize(params: Record<string, unknown>, options?: RequestOptions): Promise<TokenizeResult>;
  detokenize(params: Record<string, unknown>, options?: RequestOptions): Promise<DetokenizeResult>;
  ping(options?: RequestOptions): Promise<ResultEvent>;
  /** stdin EOF, wait up to closeTimeout for the server to exit, then kill it (a socket is closed). */
  close(): Promise<void>;
}

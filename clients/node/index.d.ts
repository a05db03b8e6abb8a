// Types for reflex-client (index.js). The wire format is protocol/PROTOCOL.md.

export declare const PROTOCOL: number;

/** The kinds of protocol error results, plus "connection" for client-side failures. */
export type ErrorKind =
  | 'parse_error' | 'invalid_request' | 'unknown_op' | 'line_too_long'
  | 'model_not_found' | 'gguf_error' | 'state_error' | 'unsupported_architecture'
  | 'context_overflow' | 'out_of_memory' | 'cuda_error' | 'cancelled' | 'too_large'
  | 'internal' | 'connection';

export declare class ReflexError extends Error {
  constructor(kind: ErrorKind | string, message: string, response?: ResultEvent | null, options?: { cause?: unknown });
  /** The protocol's error kind ("connection": the server could not be started, reached, or went away). */
  readonly kind: ErrorKind | string;
  /** The result line of the failed request, when the server sent one. */
  readonly response: ResultEvent | null;
}

export type Id = string | number | null;

/** What runs a model (PROTOCOL.md, "The ready event"). */
export type Backend = 'numpy' | 'cpu' | 'cuda';

export interface ReadyEvent {
  event: 'ready';
  id: null;
  protocol: number;
  version: string;
  pid: number;
  /** The active model's backend: 'numpy' | 'cpu' | 'cuda'; null until a model is loaded. */
  backend: Backend | null;
  model: string | null;
  [key: string]: unknown;
}

export interface TokenEvent {
  event: 'token';
  id: Id;
  token_id: number;
  text: string;
  /** The token's entry when the request asked for logprobs. */
  logprobs?: LogprobEntry;
  /** Reasoning text that became final with this token (a reasoning model's <think> block). */
  reasoning_content?: string;
  /** The choice, with n > 1. */
  index?: number;
  [key: string]: unknown;
}

/** A chat message; other keys (tool_calls, tool_call_id, name, ...) go to the template as they are. */
export interface Message {
  role: 'system' | 'user' | 'assistant' | 'tool' | string;
  content: string | null | { type: 'text'; text: string }[];
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  [key: string]: unknown;
}

/** An OpenAI-style function tool. */
export interface Tool {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

export interface ToolCall {
  id?: string;
  type: 'function';
  /** arguments: JSON text. */
  function: { name: string; arguments: string | Record<string, unknown> };
}

export interface TopLogprob {
  token_id: number;
  text: string;
  logprob: number;
}

/** One generated token's log-probability (softmax after temperature, before truncation) and the N most likely. */
export interface LogprobEntry extends TopLogprob {
  top: TopLogprob[];
}

/** What chat requests add (generate, system1, tokenize with messages). */
export interface ChatParams {
  /** Instead of prompt/text: rendered with the model's chat template. */
  messages?: Message[];
  tools?: Tool[];
  /** A Jinja template instead of the GGUF's. */
  chat_template?: string;
  /** More template variables, e.g. { enable_thinking: false }. */
  chat_template_kwargs?: Record<string, unknown>;
  /** The template's thinking switch (Qwen3-style); default: the template's. */
  enable_thinking?: boolean | null;
  /** Default true. */
  add_generation_prompt?: boolean;
}

/** Constraints and extras of generate and infill. */
export interface DecodeParams {
  /** 0-20: per-token log-probabilities and the N most likely tokens. */
  logprobs?: number;
  /** Default true: reuse the previous request's prompt prefix. */
  cache_prompt?: boolean;
  /** Default true: start from the prefix cache's saved state of the prompt's leading tokens
   * (shared by the machine's reflex processes) and save this prompt's there after the answer. */
  prefix_cache?: boolean;
  /** A JSON Schema the output must match (at most one of json_schema, regex, grammar). */
  json_schema?: Record<string, unknown> | boolean;
  regex?: string;
  /** Lark syntax. */
  grammar?: string;
  /** Default 1 (off): locally typical sampling. */
  typical_p?: number;
  /** Default 0: subtracted per occurrence in the last repeat_last_n tokens. */
  frequency_penalty?: number;
  /** Default 0: subtracted once from each token in the last repeat_last_n tokens. */
  presence_penalty?: number;
  /** Token id (decimal string) -> bias added to its logit, -100..100. */
  logit_bias?: Record<string, number> | null;
  /** Default 0 (off): the DRY repetition penalty. */
  dry_multiplier?: number;
  /** Default 1.75. */
  dry_base?: number;
  /** Default 2. */
  dry_allowed_length?: number;
  /** Default 64 (0: off). */
  dry_penalty_last_n?: number;
  /** Default ["\n", ":", "\"", "*"]. */
  dry_sequence_breakers?: string[];
  /** Default 1: choices, generated one after another from the prompt's state. */
  n?: number;
  /** Reasoning models: close the <think> block after this many tokens; default null (no limit). */
  thinking_budget?: number | null;
}

export interface ResultEvent {
  event: 'result';
  id: Id;
  op: string | null;
  ok: boolean;
  error?: { kind: ErrorKind; message: string };
  timings?: Timings;
  [key: string]: unknown;
}

export type StreamEvent = TokenEvent | ResultEvent;

/** Every op that uses a model also takes these. */
export interface ModelParams {
  /** A GGUF path or an alias (e.g. smollm2); default: the active model. */
  model?: string;
  /** "auto" (CUDA when usable, else CPU), "cpu" or "cuda". */
  device?: string;
}

export interface Timings {
  parse: number;
  total: number;
  load?: number;
  prompt_eval?: number;
  decode?: number;
  process_start_to_first_token?: number;
  [key: string]: number | undefined;
}

export interface GenerateParams extends ModelParams, ChatParams, DecodeParams {
  /** Exactly one of prompt and messages. */
  prompt?: string;
  /** Default 64. */
  max_tokens?: number;
  /** Default 0 (greedy). */
  temperature?: number;
  /** Default 0 (off). */
  top_k?: number;
  /** Default 1. */
  top_p?: number;
  /** Default 0. */
  min_p?: number;
  /** Default null (random). */
  seed?: number | null;
  /** Default 1. */
  repeat_penalty?: number;
  /** Default 64. */
  repeat_last_n?: number;
  stop?: string | string[];
  /** A saved state file to start from (protocol/STATE.md); prompt is then the text after its tokens. */
  kv_import?: string | null;
  /** Save the state to this file once the prompt is evaluated. */
  kv_export?: string | null;
}

export interface GenerateResult extends ResultEvent {
  text: string;
  token_ids: number[];
  finish_reason: 'stop' | 'length' | 'stop_string';
  prompt_tokens: number;
  completion_tokens: number;
  /** Prompt tokens whose state was reused (not evaluated again). */
  cached_tokens: number;
  /** With logprobs: one entry per generated token. */
  logprobs?: LogprobEntry[];
  /** With tools, when the model called one (Hermes/Qwen <tool_call> or Llama 3 JSON). */
  tool_calls?: ToolCall[];
  /** With tool_calls: the text outside them. */
  content?: string;
  /** Chat with a reasoning model: the text of its <think> block (text is then the rest). */
  reasoning_content?: string;
  /** With n > 1: every choice (the fields above are choice 0's). */
  choices?: Choice[];
  kv_import?: StateFileInfo;
  kv_export?: StateFileInfo;
  model: string;
  timings: Timings;
}

/** One of the n choices of generate or infill. */
export interface Choice {
  index: number;
  text: string;
  token_ids: number[];
  finish_reason: 'stop' | 'length' | 'stop_string';
  completion_tokens: number;
  logprobs?: LogprobEntry[];
  tool_calls?: ToolCall[];
  content?: string;
  reasoning_content?: string;
}

export interface System1Params extends ModelParams, ChatParams {
  /** Exactly one of prompt and messages. */
  prompt?: string;
  candidates: string[];
  /** Default 1. */
  temperature?: number;
  /** Default true: reuse the state of the prompt prefix shared with the previous request. */
  cache_prompt?: boolean;
  /** Default true: start from the prefix cache's saved state of the prompt's leading tokens
   * (shared by the machine's reflex processes) and save this prompt's there after the answer. */
  prefix_cache?: boolean;
  /** A saved state file to start from (protocol/STATE.md); prompt is then the text after its tokens. */
  kv_import?: string | null;
  /** Save the state to this file once the prompt is evaluated. */
  kv_export?: string | null;
}

export interface ClassifyParams extends ModelParams, ChatParams {
  /** Exactly one of input and messages; input is continued by each label as written. */
  input?: string;
  /** 1 to 64 distinct labels. */
  labels: string[];
  /** A batch over the shared input: each question appended (to messages as a last user message). */
  questions?: string[];
  /** Default 1. */
  temperature?: number;
  /** Default true: reuse the state of the prompt prefix shared with the previous request. */
  cache_prompt?: boolean;
}

export interface ClassifyLabel {
  label: string;
  /** Softmax of logprob / temperature over the labels. */
  probability: number;
  /** The sum of the label's token log-probabilities. */
  logprob: number;
  mean_logprob: number;
  /** The label's token count after this prompt. */
  tokens: number;
}

export interface ClassifyDecision {
  labels: ClassifyLabel[];
  best: string;
  best_idx: number;
  /** Bits. */
  entropy: number;
  prompt_tokens: number;
  cached_tokens: number;
}

export interface ClassifyResult extends ResultEvent {
  /** Without questions: the decision's fields. */
  labels?: ClassifyLabel[];
  best?: string;
  best_idx?: number;
  entropy?: number;
  /** With questions: one decision per question. */
  results?: (ClassifyDecision & { question: string })[];
  prompt_tokens: number;
  cached_tokens: number;
  /** Present when the labels tokenize to different lengths. */
  warning?: string;
  model: string;
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
  prompt_tokens: number;
  /** The candidates' tokens, all together. */
  candidate_tokens: number;
  /** Prompt tokens whose state was reused (not evaluated again). */
  cached_tokens: number;
  kv_import?: StateFileInfo;
  kv_export?: StateFileInfo;
  model: string;
  timings: Timings;
}

export interface EmbedParams extends ModelParams {
  input: string | string[];
  /** Default "mean". */
  pooling?: 'mean' | 'last' | 'cls';
  /** Default false. */
  normalize?: boolean;
  /** Default true; with pooling "last" only: the prefix cache, as in generate. */
  prefix_cache?: boolean;
}

export interface EmbedResult extends ResultEvent {
  /** One vector per input string (a list even for one string). */
  embeddings: number[][];
  dim: number;
  /** Each input's token count. */
  n_tokens: number[];
  model: string;
  timings: Timings;
}

export interface TokenizeParams extends ModelParams, ChatParams {
  /** Exactly one of text and messages. */
  text?: string;
  /** Default false. */
  add_bos?: boolean;
  /** Default true. */
  parse_special?: boolean;
}

export interface TokenizeResult extends ResultEvent {
  token_ids: number[];
  /** With messages: the rendered conversation. */
  prompt?: string;
  model: string;
  timings: Timings;
}

export interface InfillParams extends ModelParams, DecodeParams {
  prefix: string;
  suffix?: string;
  /** Other files of the project as context. */
  input_extra?: { filename?: string; text: string }[];
  /** Text after the prefix (special tokens parsed). */
  prompt?: string;
  /** llama.cpp's n_indent: end at the first new line indented by fewer spaces/tabs (0: off). */
  n_indent?: number;
  /** llama.cpp's t_max_predict_ms: end at a newline once this many ms of generation passed (0: off). */
  t_max_predict_ms?: number;
  max_tokens?: number;
  temperature?: number;
  top_k?: number;
  top_p?: number;
  min_p?: number;
  seed?: number | null;
  repeat_penalty?: number;
  repeat_last_n?: number;
  stop?: string | string[];
}

export interface DetokenizeParams extends ModelParams {
  token_ids: number[];
  /** Render control tokens (e.g. <|im_end|>) as their text. Default false: dropped. */
  special?: boolean;
}

export interface DetokenizeResult extends ResultEvent {
  text: string;
  model: string;
  timings: Timings;
}

export interface StateParams extends ModelParams {
  path: string;
}

export interface StateResult extends ResultEvent {
  path: string;
  n_tokens: number;
  /** state_save only: the file's size. */
  bytes?: number;
  model: string;
  timings: Timings;
}

/** kv_import / kv_export in a result. */
export interface StateFileInfo {
  path: string;
  n_tokens: number;
  bytes?: number;
}

export interface HelloResult extends ResultEvent {
  protocol: number;
  version: string;
  pid: number;
  backend: Backend | null;
  model: string | null;
  ops: string[];
  error_kinds: string[];
  limits: { max_line_bytes: number; max_tokens: number };
  models: { model: string; path: string; device: string; backend: Backend }[];
}

export interface LoadResult extends ResultEvent {
  model: string;
  path: string;
  architecture: string;
  backend: Backend;
  /** The device it runs on: 'cpu' or 'cuda'. */
  device: string;
  n_vocab: number;
  n_ctx: number;
  cached: boolean;
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
  /** generate on a conversation (messages rendered with the model's chat template). */
  chat(messages: Message[], params?: Omit<GenerateParams, 'prompt' | 'messages'>, options?: RequestOptions): Promise<GenerateResult>;
  streamChat(messages: Message[], params?: Omit<GenerateParams, 'prompt' | 'messages'>, options?: RequestOptions): AsyncGenerator<StreamEvent, void, undefined>;
  /** Fill in the middle (models with FIM tokens); the result is generate's. */
  infill(params: InfillParams, options?: RequestOptions): Promise<GenerateResult>;
  streamInfill(params: InfillParams, options?: RequestOptions): AsyncGenerator<StreamEvent, void, undefined>;
  system1(params: System1Params, options?: RequestOptions): Promise<System1Result>;
  /** The decision op: labels with probabilities, best, entropy (a batch with questions). */
  classify(params: ClassifyParams, options?: RequestOptions): Promise<ClassifyResult>;
  embed(params: EmbedParams, options?: RequestOptions): Promise<EmbedResult>;
  tokenize(params: TokenizeParams, options?: RequestOptions): Promise<TokenizeResult>;
  detokenize(params: DetokenizeParams, options?: RequestOptions): Promise<DetokenizeResult>;
  /** Save the loop's current state to params.path (protocol/STATE.md). */
  stateSave(params: StateParams, options?: RequestOptions): Promise<StateResult>;
  /** Load a saved state: a later request whose tokens start with its tokens evaluates only the rest. */
  stateLoad(params: StateParams, options?: RequestOptions): Promise<StateResult>;
  hello(params?: { protocol?: number }, options?: RequestOptions): Promise<HelloResult>;
  load(params?: ModelParams, options?: RequestOptions): Promise<LoadResult>;
  ping(options?: RequestOptions): Promise<ResultEvent>;
  /** stdin EOF, wait up to closeTimeout for the server to exit, then kill it (a socket is closed). */
  close(): Promise<void>;
}

package reflex

import "context"

// The ops of PROTOCOL.md. A zero field is left out of the request, so the
// server's default applies; where zero is itself a meaningful value (seed,
// repeat_last_n, parse_special) the field is a pointer: nil means the default.

// Timings are the result's milliseconds (parse, total, load, prompt_eval, decode, ...).
type Timings map[string]float64

// Message is one chat message. Content is a string (or nil); ToolCalls and
// ToolCallID carry a tool round-trip to the template.
type Message struct {
	Role       string     `json:"role"`
	Content    any        `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	Name       string     `json:"name,omitempty"`
}

// Tool is an OpenAI-style function tool.
type Tool struct {
	Type     string       `json:"type"` // "function"
	Function ToolFunction `json:"function"`
}

// ToolFunction describes a callable function; Parameters is a JSON Schema.
type ToolFunction struct {
	Name        string         `json:"name"`
	Description string         `json:"description,omitempty"`
	Parameters  map[string]any `json:"parameters,omitempty"`
}

// ToolCall is a call the model made (results) or made earlier (messages).
type ToolCall struct {
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type"` // "function"
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction: the function's name and its arguments as JSON text.
type ToolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// TopLogprob is one of the most likely tokens at a step.
type TopLogprob struct {
	TokenID int     `json:"token_id"`
	Text    string  `json:"text"`
	Logprob float64 `json:"logprob"`
}

// LogprobEntry is a generated token's log-probability (softmax after the
// temperature, before truncation) with the N most likely tokens.
type LogprobEntry struct {
	TokenID int          `json:"token_id"`
	Text    string       `json:"text"`
	Logprob float64      `json:"logprob"`
	Top     []TopLogprob `json:"top"`
}

// Decode options shared by generate and infill.
type DecodeOptions struct {
	Logprobs    *int   `json:"logprobs,omitempty"`     // nil: none; 0-20
	CachePrompt *bool  `json:"cache_prompt,omitempty"` // nil: true
	PrefixCache *bool  `json:"prefix_cache,omitempty"` // nil: true (the machine's prefix cache; false: skip it)
	JSONSchema  any    `json:"json_schema,omitempty"`  // a JSON Schema (map or json.RawMessage)
	Regex       string `json:"regex,omitempty"`
	Grammar     string `json:"grammar,omitempty"` // Lark syntax
}

// ChatOptions: what a request with Messages may add.
type ChatOptions struct {
	Tools               []Tool         `json:"tools,omitempty"`
	ChatTemplate        string         `json:"chat_template,omitempty"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs,omitempty"`
	EnableThinking      *bool          `json:"enable_thinking,omitempty"`       // nil: the template's default
	AddGenerationPrompt *bool          `json:"add_generation_prompt,omitempty"` // nil: true
}

// SamplingOptions: generate's and infill's further sampling parameters (PROTOCOL.md,
// "Sampling"); zero values leave them off.
type SamplingOptions struct {
	TypicalP            float64            `json:"typical_p,omitempty"`         // 0: 1.0 (off)
	FrequencyPenalty    float64            `json:"frequency_penalty,omitempty"` // over the last repeat_last_n tokens
	PresencePenalty     float64            `json:"presence_penalty,omitempty"`
	LogitBias           map[string]float64 `json:"logit_bias,omitempty"`            // token id (decimal) -> bias, -100..100
	DryMultiplier       float64            `json:"dry_multiplier,omitempty"`        // 0: DRY off
	DryBase             float64            `json:"dry_base,omitempty"`              // 0: 1.75
	DryAllowedLength    *int               `json:"dry_allowed_length,omitempty"`    // nil: 2
	DryPenaltyLastN     *int               `json:"dry_penalty_last_n,omitempty"`    // nil: 64
	DrySequenceBreakers []string           `json:"dry_sequence_breakers,omitempty"` // nil: "\n", ":", "\"", "*"
	N                   int                `json:"n,omitempty"`                     // 0: 1 choice
	ThinkingBudget      *int               `json:"thinking_budget,omitempty"`       // nil: no limit
}

// GenerateRequest: generate's parameters. Exactly one of Prompt and Messages.
type GenerateRequest struct {
	Prompt   string    `json:"prompt,omitempty"`
	Messages []Message `json:"messages,omitempty"`
	ChatOptions
	DecodeOptions
	SamplingOptions
	MaxTokens     int      `json:"max_tokens,omitempty"`     // 0: 64
	Temperature   float64  `json:"temperature,omitempty"`    // 0: greedy
	TopK          int      `json:"top_k,omitempty"`          // 0: off
	TopP          float64  `json:"top_p,omitempty"`          // 0: 1.0
	MinP          float64  `json:"min_p,omitempty"`          // 0: off
	Seed          *int64   `json:"seed,omitempty"`           // nil: random; 0 <= seed < 2^63
	RepeatPenalty float64  `json:"repeat_penalty,omitempty"` // 0: 1.0
	RepeatLastN   *int     `json:"repeat_last_n,omitempty"`  // nil: 64
	Stop          []string `json:"stop,omitempty"`
	KVImport      string   `json:"kv_import,omitempty"` // a saved state to start from; Prompt follows its tokens
	KVExport      string   `json:"kv_export,omitempty"` // save the state here once the prompt is evaluated
	Model         string   `json:"model,omitempty"`
	Device        string   `json:"device,omitempty"` // "": the active model's, else "auto"; "cpu", "cuda", "numpy"
}

// GenerateResult: generate's result.
type GenerateResult struct {
	Text             string         `json:"text"`
	TokenIDs         []int          `json:"token_ids"`
	FinishReason     string         `json:"finish_reason"` // "stop", "length" or "stop_string"
	PromptTokens     int            `json:"prompt_tokens"`
	CompletionTokens int            `json:"completion_tokens"`
	CachedTokens     int            `json:"cached_tokens"` // prompt tokens whose state was reused
	Logprobs         []LogprobEntry `json:"logprobs,omitempty"`
	ToolCalls        []ToolCall     `json:"tool_calls,omitempty"` // with Tools, when the model called one
	Content          string         `json:"content,omitempty"`    // with ToolCalls: the text outside them
	// ReasoningContent: chat with a reasoning model, the text of its <think> block (Text: the rest).
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	Choices          []Choice   `json:"choices,omitempty"` // with N > 1: every choice (the fields above are choice 0's)
	KVImport         *StateInfo `json:"kv_import,omitempty"`
	KVExport         *StateInfo `json:"kv_export,omitempty"`
	Model            string     `json:"model"`
	Timings          Timings    `json:"timings"`
}

// Choice is one of N choices of generate or infill.
type Choice struct {
	Index            int            `json:"index"`
	Text             string         `json:"text"`
	TokenIDs         []int          `json:"token_ids"`
	FinishReason     string         `json:"finish_reason"`
	CompletionTokens int            `json:"completion_tokens"`
	Logprobs         []LogprobEntry `json:"logprobs,omitempty"`
	ToolCalls        []ToolCall     `json:"tool_calls,omitempty"`
	Content          string         `json:"content,omitempty"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
}

// InfillRequest: infill's parameters (fill in the middle; models with FIM tokens).
type InfillRequest struct {
	Prefix        string       `json:"prefix"`
	Suffix        string       `json:"suffix"`
	InputExtra    []ExtraChunk `json:"input_extra,omitempty"`
	Prompt        string       `json:"prompt,omitempty"`
	NIndent       int          `json:"n_indent,omitempty"`         // 0: off; llama.cpp's n_indent
	TMaxPredictMs int64        `json:"t_max_predict_ms,omitempty"` // 0: off; llama.cpp's t_max_predict_ms
	MaxTokens     int          `json:"max_tokens,omitempty"`
	Temperature   float64      `json:"temperature,omitempty"`
	TopK          int          `json:"top_k,omitempty"`
	TopP          float64      `json:"top_p,omitempty"`
	MinP          float64      `json:"min_p,omitempty"`
	Seed          *int64       `json:"seed,omitempty"`
	RepeatPenalty float64      `json:"repeat_penalty,omitempty"`
	RepeatLastN   *int         `json:"repeat_last_n,omitempty"`
	Stop          []string     `json:"stop,omitempty"`
	DecodeOptions
	SamplingOptions
	Model  string `json:"model,omitempty"`
	Device string `json:"device,omitempty"`
}

// ExtraChunk is another file given to infill as context.
type ExtraChunk struct {
	Filename string `json:"filename,omitempty"`
	Text     string `json:"text"`
}

// System1Request: system1's parameters. Exactly one of Prompt and Messages.
type System1Request struct {
	Prompt     string    `json:"prompt,omitempty"`
	Messages   []Message `json:"messages,omitempty"`
	Candidates []string  `json:"candidates"`
	// EnableThinking: with Messages, the chat template's thinking switch (nil: its default).
	EnableThinking *bool   `json:"enable_thinking,omitempty"`
	Temperature    float64 `json:"temperature,omitempty"`  // 0: 1.0
	CachePrompt    *bool   `json:"cache_prompt,omitempty"` // nil: true
	PrefixCache    *bool   `json:"prefix_cache,omitempty"` // nil: true (the machine's prefix cache; false: skip it)
	KVImport       string  `json:"kv_import,omitempty"`
	KVExport       string  `json:"kv_export,omitempty"`
	Model          string  `json:"model,omitempty"`
	Device         string  `json:"device,omitempty"`
}

// Candidate is one scored candidate of system1.
type Candidate struct {
	Text        string  `json:"text"`
	TokenIDs    []int   `json:"token_ids"`
	Logprob     float64 `json:"logprob"`
	MeanLogprob float64 `json:"mean_logprob"`
	Probability float64 `json:"probability"`
}

// System1Result: system1's result.
type System1Result struct {
	Candidates   []Candidate `json:"candidates"`
	BestIdx      int         `json:"best_idx"`
	Entropy      float64     `json:"entropy"`
	PromptTokens int         `json:"prompt_tokens"`
	// CandidateTokens: the candidates' tokens, all together.
	CandidateTokens int        `json:"candidate_tokens"`
	CachedTokens    int        `json:"cached_tokens"` // prompt tokens whose state was reused
	KVImport        *StateInfo `json:"kv_import,omitempty"`
	KVExport        *StateInfo `json:"kv_export,omitempty"`
	Model           string     `json:"model"`
	Timings         Timings    `json:"timings"`
}

// ClassifyRequest: classify's parameters. Exactly one of Input and Messages; the labels
// continue Input as written (give the leading space the text needs).
type ClassifyRequest struct {
	Input    string    `json:"input,omitempty"`
	Messages []Message `json:"messages,omitempty"`
	Labels   []string  `json:"labels"` // 1 to 64, distinct
	// Questions: a batch over the shared Input (or Messages), one decision per question.
	Questions   []string `json:"questions,omitempty"`
	Temperature float64  `json:"temperature,omitempty"`  // 0: 1.0
	CachePrompt *bool    `json:"cache_prompt,omitempty"` // nil: true
	Model       string   `json:"model,omitempty"`
	Device      string   `json:"device,omitempty"`
}

// LabelScore is one label of a classify decision.
type LabelScore struct {
	Label       string  `json:"label"`
	Probability float64 `json:"probability"` // softmax of logprob / temperature over the labels
	Logprob     float64 `json:"logprob"`     // the sum of the label's token log-probabilities
	MeanLogprob float64 `json:"mean_logprob"`
	Tokens      int     `json:"tokens"` // the label's token count after this prompt
}

// Decision is one classify decision (a question's, with Questions).
type Decision struct {
	Question     string       `json:"question,omitempty"`
	Labels       []LabelScore `json:"labels"`
	Best         string       `json:"best"`
	BestIdx      int          `json:"best_idx"`
	Entropy      float64      `json:"entropy"` // bits
	PromptTokens int          `json:"prompt_tokens"`
	CachedTokens int          `json:"cached_tokens"`
}

// ClassifyResult: classify's result. Without Questions the decision's fields are set
// (Labels, Best, BestIdx, Entropy); with them, Results holds one decision per question.
type ClassifyResult struct {
	Labels       []LabelScore `json:"labels,omitempty"`
	Best         string       `json:"best,omitempty"`
	BestIdx      int          `json:"best_idx"`
	Entropy      float64      `json:"entropy"`
	Results      []Decision   `json:"results,omitempty"`
	PromptTokens int          `json:"prompt_tokens"`
	CachedTokens int          `json:"cached_tokens"`
	Warning      string       `json:"warning,omitempty"` // set when the labels tokenize to different lengths
	Model        string       `json:"model"`
	Timings      Timings      `json:"timings"`
}

// EmbedRequest: embed's parameters.
type EmbedRequest struct {
	Input     []string `json:"input"`
	Pooling   string   `json:"pooling,omitempty"` // "": "mean"; "last", "cls"
	Normalize bool     `json:"normalize,omitempty"`
	// nil: true; with Pooling "last" only: the machine's prefix cache (false: skip it)
	PrefixCache *bool  `json:"prefix_cache,omitempty"`
	Model       string `json:"model,omitempty"`
	Device      string `json:"device,omitempty"`
}

// EmbedResult: embed's result, one vector per input string.
type EmbedResult struct {
	Embeddings [][]float64 `json:"embeddings"`
	Dim        int         `json:"dim"`
	NTokens    []int       `json:"n_tokens"` // each input's token count
	Model      string      `json:"model"`
	Timings    Timings     `json:"timings"`
}

// TokenizeRequest: tokenize's parameters. Exactly one of Text and Messages.
type TokenizeRequest struct {
	Text     string    `json:"text,omitempty"`
	Messages []Message `json:"messages,omitempty"`
	ChatOptions
	AddBOS       bool   `json:"add_bos,omitempty"`
	ParseSpecial *bool  `json:"parse_special,omitempty"` // nil: true
	Model        string `json:"model,omitempty"`
	Device       string `json:"device,omitempty"`
}

// TokenizeResult: tokenize's result.
type TokenizeResult struct {
	TokenIDs []int   `json:"token_ids"`
	Prompt   string  `json:"prompt,omitempty"` // with Messages: the rendered conversation
	Model    string  `json:"model"`
	Timings  Timings `json:"timings"`
}

// DetokenizeRequest: detokenize's parameters.
type DetokenizeRequest struct {
	TokenIDs []int `json:"token_ids"`
	// Special renders control tokens (e.g. <|im_end|>) as their text; false drops them.
	Special bool   `json:"special,omitempty"`
	Model   string `json:"model,omitempty"`
	Device  string `json:"device,omitempty"`
}

// DetokenizeResult: detokenize's result.
type DetokenizeResult struct {
	Text    string  `json:"text"`
	Model   string  `json:"model"`
	Timings Timings `json:"timings"`
}

// StateRequest: state_save's and state_load's parameters.
type StateRequest struct {
	Path   string `json:"path"`
	Model  string `json:"model,omitempty"`
	Device string `json:"device,omitempty"`
}

// StateInfo describes a saved state file (protocol/STATE.md).
type StateInfo struct {
	Path    string `json:"path"`
	NTokens int    `json:"n_tokens"`
	Bytes   int64  `json:"bytes,omitempty"` // saves only
}

// StateResult: state_save's and state_load's result.
type StateResult struct {
	StateInfo
	Model   string  `json:"model"`
	Timings Timings `json:"timings"`
}

// Generate runs generate (not streamed) and returns its result.
func (c *Client) Generate(ctx context.Context, req GenerateRequest) (*GenerateResult, error) {
	return call[GenerateResult](ctx, c, "generate", req)
}

// Stream runs generate with stream: true. Read it with Next/Event (the token
// events, then the result); Close it to cancel early:
//
//	s, err := c.Stream(ctx, req)
//	if err != nil { ... }
//	defer s.Close()
//	for s.Next() { ev := s.Event(); ... }
//	if err := s.Err(); err != nil { ... }
func (c *Client) Stream(ctx context.Context, req GenerateRequest) (*Stream, error) {
	return c.start(ctx, "generate", req, true)
}

// Chat runs generate on a conversation rendered with the model's chat template.
func (c *Client) Chat(ctx context.Context, messages []Message, req GenerateRequest) (*GenerateResult, error) {
	req.Prompt, req.Messages = "", messages
	return call[GenerateResult](ctx, c, "generate", req)
}

// Infill fills in the middle between Prefix and Suffix.
func (c *Client) Infill(ctx context.Context, req InfillRequest) (*GenerateResult, error) {
	return call[GenerateResult](ctx, c, "infill", req)
}

// StreamInfill runs infill with stream: true (read it as Stream's).
func (c *Client) StreamInfill(ctx context.Context, req InfillRequest) (*Stream, error) {
	return c.start(ctx, "infill", req, true)
}

// Intp and Boolp make the pointer fields (Logprobs, CachePrompt, ...).
func Intp(v int) *int { return &v }

// Boolp returns a pointer to v.
func Boolp(v bool) *bool { return &v }

// System1 scores each candidate as a continuation of the prompt.
func (c *Client) System1(ctx context.Context, req System1Request) (*System1Result, error) {
	return call[System1Result](ctx, c, "system1", req)
}

// Classify picks one of the labels for a text or a conversation (system1 with labels):
// each label's probability, the best one, the entropy; a batch with Questions.
func (c *Client) Classify(ctx context.Context, req ClassifyRequest) (*ClassifyResult, error) {
	return call[ClassifyResult](ctx, c, "classify", req)
}

// Embed returns one embedding per input string.
func (c *Client) Embed(ctx context.Context, req EmbedRequest) (*EmbedResult, error) {
	return call[EmbedResult](ctx, c, "embed", req)
}

// Tokenize returns the token ids of a text.
func (c *Client) Tokenize(ctx context.Context, req TokenizeRequest) (*TokenizeResult, error) {
	return call[TokenizeResult](ctx, c, "tokenize", req)
}

// Detokenize returns the text of token ids.
func (c *Client) Detokenize(ctx context.Context, req DetokenizeRequest) (*DetokenizeResult, error) {
	return call[DetokenizeResult](ctx, c, "detokenize", req)
}

// StateSave saves the loop's current state (the tokens it holds) to req.Path.
func (c *Client) StateSave(ctx context.Context, req StateRequest) (*StateResult, error) {
	return call[StateResult](ctx, c, "state_save", req)
}

// StateLoad loads a saved state: a later request whose tokens start with its
// tokens evaluates only the rest.
func (c *Client) StateLoad(ctx context.Context, req StateRequest) (*StateResult, error) {
	return call[StateResult](ctx, c, "state_load", req)
}

// Ping checks that the server answers (it loads no model).
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Request(ctx, "ping", nil)
	return err
}

func call[T any](ctx context.Context, c *Client, op string, req any) (*T, error) {
	ev, err := c.Request(ctx, op, req)
	if err != nil {
		return nil, err
	}
	var out T
	if err := ev.Decode(&out); err != nil {
		return nil, &Error{Kind: "connection", Message: "cannot decode the " + op + " result: " + err.Error(), Response: ev}
	}
	return &out, nil
}

package reflex

// The client against the real server (`reflex stdio`, or $REFLEX_CMD).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	sharedOnce   sync.Once
	sharedClient *Client
	sharedErr    error
)

func shared(t *testing.T) *Client {
	t.Helper()
	sharedOnce.Do(func() { sharedClient, sharedErr = Spawn(context.Background(), reflexOptions()) })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedClient
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedClient != nil {
		sharedClient.Close()
	}
	os.Exit(code)
}

var long = GenerateRequest{Prompt: "Once upon a time, in a land far away,", MaxTokens: 256}

func readyPid(c *Client) int {
	var r struct{ Pid int }
	c.Ready().Decode(&r)
	return r.Pid
}

func TestVectors(t *testing.T) {
	files := vectorFiles()
	if len(files) == 0 {
		t.Fatal("protocol/vectors/*.jsonl: no conformance cases found")
	}
	c := shared(t)
	model, err := modelUnderTest(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			cases, err := loadCases(file, model)
			if err != nil {
				t.Fatal(err)
			}
			for _, vc := range cases {
				bad, err := runCase(context.Background(), c, vc)
				if err != nil {
					t.Fatalf("%s: %v", vc.Name, err)
				}
				for _, b := range bad {
					t.Errorf("%s: %s", vc.Name, b)
				}
			}
		})
	}
}

func TestGenerateMatchesStream(t *testing.T) {
	c, ctx := shared(t), context.Background()
	req := GenerateRequest{Prompt: "The capital of France is", MaxTokens: 6}
	r, err := c.Generate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Stream(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var text strings.Builder
	var ids []int
	for s.Next() {
		if ev := s.Event(); ev.Event == "token" {
			text.WriteString(ev.Text)
			ids = append(ids, ev.TokenID)
		}
	}
	if s.Err() != nil || s.Result() == nil {
		t.Fatal(s.Err())
	}
	if text.String() != r.Text || len(ids) != len(r.TokenIDs) || r.FinishReason == "" {
		t.Fatalf("stream %q %v != generate %q %v", text.String(), ids, r.Text, r.TokenIDs)
	}
}

func TestOtherOps(t *testing.T) {
	c, ctx := shared(t), context.Background()
	tk, err := c.Tokenize(ctx, TokenizeRequest{Text: "Hello world"})
	if err != nil {
		t.Fatal(err)
	}
	dt, err := c.Detokenize(ctx, DetokenizeRequest{TokenIDs: tk.TokenIDs})
	if err != nil || dt.Text != "Hello world" {
		t.Fatalf("detokenize: %v %+v", err, dt)
	}
	sp, err := c.Tokenize(ctx, TokenizeRequest{Text: "Hello <|im_end|>"})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := c.Detokenize(ctx, DetokenizeRequest{TokenIDs: sp.TokenIDs, Special: true})
	if err != nil || ds.Text != "Hello <|im_end|>" {
		t.Fatalf("detokenize special: %v %+v", err, ds)
	}
	s1, err := c.System1(ctx, System1Request{Prompt: "Is the sky blue? Answer:", Candidates: []string{" yes", " no"}})
	if err != nil || len(s1.Candidates) != 2 {
		t.Fatalf("system1: %v %+v", err, s1)
	}
	e, err := c.Embed(ctx, EmbedRequest{Input: []string{"a", "b"}, Normalize: true})
	if err != nil || len(e.Embeddings) != 2 || len(e.Embeddings[0]) != e.Dim {
		t.Fatalf("embed: %v", err)
	}
}

func TestClassify(t *testing.T) {
	c, ctx := shared(t), context.Background()
	labels := []string{" yes", " no"}
	// CachePrompt false: both evaluate the whole prompt in one pass, so the two agree exactly
	// whatever batch shapes the backend's kernels are sensitive to (ARCHITECTURE.md, "Batch-invariant")
	r, err := c.Classify(ctx, ClassifyRequest{Input: "Is the sky blue? Answer:", Labels: labels, CachePrompt: Boolp(false)})
	if err != nil {
		t.Fatal(err)
	}
	s1, err := c.System1(ctx, System1Request{Prompt: "Is the sky blue? Answer:", Candidates: labels, CachePrompt: Boolp(false)})
	if err != nil || r.Best != labels[s1.BestIdx] || r.Warning != "" || len(r.Labels) != 2 {
		t.Fatalf("classify %+v vs system1 %+v (%v)", r, s1, err)
	}
	for i, l := range r.Labels {
		if math.Abs(l.Probability-s1.Candidates[i].Probability) > 1e-9 || l.Tokens != 1 {
			t.Fatalf("label %d: %+v vs %+v", i, l, s1.Candidates[i])
		}
	}
	batch, err := c.Classify(ctx, ClassifyRequest{
		Messages:  []Message{{Role: "user", Content: strings.Repeat("Water is wet. ", 8)}},
		Labels:    []string{"yes", "no", "not sure"},
		Questions: []string{"Is water wet?", "Is water dry?"}})
	if err != nil || len(batch.Results) != 2 || batch.Results[1].Question != "Is water dry?" ||
		!strings.Contains(batch.Warning, "different lengths") || batch.Results[1].CachedTokens == 0 {
		t.Fatalf("batch: %v %+v", err, batch)
	}
	_, err = c.Classify(ctx, ClassifyRequest{Input: "x", Labels: []string{" a", " a"}})
	if Kind(err) != "invalid_request" {
		t.Fatalf("duplicate labels: %v", err)
	}
}

func TestChatInfillLogprobsSchema(t *testing.T) {
	c, ctx := shared(t), context.Background()
	capital := []Message{{Role: "user", Content: "How many days are in a week?"}}
	r, err := c.Chat(ctx, capital, GenerateRequest{MaxTokens: 24})
	if err != nil || !strings.Contains(r.Text, "7") || r.FinishReason != "stop" {
		t.Fatalf("chat: %v %+v", err, r)
	}
	tk, err := c.Tokenize(ctx, TokenizeRequest{Messages: capital})
	if err != nil || !strings.HasSuffix(tk.Prompt, "<|im_start|>assistant\n") || len(tk.TokenIDs) != r.PromptTokens {
		t.Fatalf("tokenize messages: %v %+v", err, tk)
	}
	_, err = c.Infill(ctx, InfillRequest{Prefix: "def f(", Suffix: ")"})
	wantKind(t, err, "invalid_request", "fill-in-the-middle")
	lp, err := c.Chat(ctx, capital, GenerateRequest{MaxTokens: 3, DecodeOptions: DecodeOptions{Logprobs: Intp(2)}})
	if err != nil || len(lp.Logprobs) != 3 || len(lp.Logprobs[0].Top) != 2 {
		t.Fatalf("logprobs: %v %+v", err, lp)
	}
	schema := map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 20}},
		"required": []string{"city"}, "additionalProperties": false}
	js, err := c.Chat(ctx, capital, GenerateRequest{MaxTokens: 40, DecodeOptions: DecodeOptions{JSONSchema: schema}})
	var obj map[string]any
	if err != nil || js.FinishReason != "stop" || json.Unmarshal([]byte(js.Text), &obj) != nil {
		t.Fatalf("json_schema: %v %+v", err, js)
	}
	_, err = c.Chat(ctx, capital, GenerateRequest{DecodeOptions: DecodeOptions{JSONSchema: map[string]any{"type": "nope"}}})
	wantKind(t, err, "invalid_request", "json_schema")
}

func TestSamplingFieldsAndChoices(t *testing.T) {
	c, ctx := shared(t), context.Background()
	prompt := "The capital of France is"
	plain, err := c.Generate(ctx, GenerateRequest{Prompt: prompt, MaxTokens: 6})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Generate(ctx, GenerateRequest{Prompt: prompt, MaxTokens: 6, SamplingOptions: SamplingOptions{
		FrequencyPenalty: 1.0, PresencePenalty: 0.5, DryMultiplier: 0.8, TypicalP: 0.95,
		LogitBias: map[string]float64{strconv.Itoa(plain.TokenIDs[0]): -100}}})
	if err != nil || r.TokenIDs[0] == plain.TokenIDs[0] {
		t.Fatalf("penalties and logit_bias: %v %+v", err, r)
	}
	seed := int64(1)
	n, err := c.Generate(ctx, GenerateRequest{Prompt: prompt, MaxTokens: 3, Temperature: 0.8, Seed: &seed,
		SamplingOptions: SamplingOptions{N: 2}})
	if err != nil || len(n.Choices) != 2 || n.Choices[1].Index != 1 || n.Text != n.Choices[0].Text {
		t.Fatalf("n: %v %+v", err, n)
	}
	on := true
	_, err = c.Chat(ctx, []Message{{Role: "user", Content: "Hi"}}, GenerateRequest{MaxTokens: 2,
		ChatOptions: ChatOptions{EnableThinking: &on}, SamplingOptions: SamplingOptions{ThinkingBudget: Intp(4)}})
	wantKind(t, err, "invalid_request", "<think>")
}

func TestSavedState(t *testing.T) {
	c, ctx := shared(t), context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "p.state")
	full, err := c.Generate(ctx, GenerateRequest{Prompt: "The capital of France is Paris. The capital of Italy is", MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Generate(ctx, GenerateRequest{Prompt: "The capital of France is Paris.", MaxTokens: 1, KVExport: p})
	if err != nil || a.KVExport == nil || a.KVExport.NTokens != a.PromptTokens {
		t.Fatalf("kv_export: %v %+v", err, a)
	}
	b, err := c.Generate(ctx, GenerateRequest{Prompt: " The capital of Italy is", MaxTokens: 4, KVImport: p})
	if err != nil || b.KVImport == nil || b.KVImport.NTokens != a.PromptTokens || fmt.Sprint(b.TokenIDs) != fmt.Sprint(full.TokenIDs) {
		t.Fatalf("kv_import: %v %+v (full %v)", err, b, full.TokenIDs)
	}
	s, err := c.StateSave(ctx, StateRequest{Path: filepath.Join(dir, "q.state")})
	if err != nil || s.NTokens == 0 || s.Bytes == 0 {
		t.Fatalf("state_save: %v %+v", err, s)
	}
	l, err := c.StateLoad(ctx, StateRequest{Path: p})
	if err != nil || l.NTokens != a.PromptTokens {
		t.Fatalf("state_load: %v %+v", err, l)
	}
	_, err = c.StateLoad(ctx, StateRequest{Path: filepath.Join(dir, "missing.state")})
	wantKind(t, err, "state_error", "")
}

func TestErrorsCarryTheKind(t *testing.T) {
	c, ctx := shared(t), context.Background()
	_, err := c.Request(ctx, "frobnicate", nil)
	wantKind(t, err, "unknown_op", "")
	var e *Error
	if !errors.As(err, &e) || e.Response == nil || e.Response.OK {
		t.Fatalf("no result in the error: %#v", err)
	}
	_, err = c.Request(ctx, "generate", map[string]any{"prompt": "x", "max_tokens": 0})
	wantKind(t, err, "invalid_request", "max_tokens")
	_, err = c.Generate(ctx, GenerateRequest{Prompt: "x", Model: "/nonexistent/model.gguf"})
	wantKind(t, err, "model_not_found", "")
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestCancelMidStream(t *testing.T) {
	c := shared(t)
	pid := readyPid(c)
	s, err := c.Stream(context.Background(), long)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if !s.Next() || s.Event().Event != "token" {
			t.Fatalf("want a token: %v", s.Err())
		}
	}
	t0 := time.Now()
	s.Close() // SIGINT, drained to the cancelled result
	if time.Since(t0) > 5*time.Second {
		t.Fatal("cancel took too long")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = c.Generate(ctx, long)
	wantKind(t, err, "cancelled", "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want DeadlineExceeded inside: %v", err)
	}
	if _, err := c.Generate(context.Background(), GenerateRequest{Prompt: "Hi", MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	if readyPid(c) != pid {
		t.Fatal("the server was restarted; SIGINT should have kept it")
	}
}

func TestChildKilledFromOutside(t *testing.T) {
	c, ctx := shared(t), context.Background()
	s, err := c.Stream(ctx, long)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Next() {
		t.Fatal(s.Err())
	}
	pid := readyPid(c)
	syscall.Kill(pid, syscall.SIGKILL)
	for s.Next() {
	}
	wantKind(t, s.Err(), "connection", "killed")
	if err := c.Ping(ctx); err != nil || readyPid(c) == pid {
		t.Fatalf("not restarted: %v", err)
	}
	pid = readyPid(c)
	syscall.Kill(pid, syscall.SIGKILL) // while idle: replaced on the next call
	time.Sleep(200 * time.Millisecond)
	if err := c.Ping(ctx); err != nil || readyPid(c) == pid {
		t.Fatalf("not restarted: %v", err)
	}
}

func TestUDS(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "reflex.sock")
	o := reflexOptions()
	args := append([]string{}, o.Args...)
	i := len(args)
	for j := range args {
		if args[j] == "stdio" {
			i = j
		}
	}
	tail := []string{}
	if i < len(args) {
		tail = args[i+1:]
	}
	args = append(append(args[:i:i], "uds", sock), tail...)
	server := exec.Command(o.Command, args...)
	server.Stderr = os.Stderr
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		server.Process.Signal(syscall.SIGTERM)
		if err := server.Wait(); err != nil {
			t.Errorf("reflex uds: %v", err)
		}
	}()
	for t0 := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Since(t0) > 30*time.Second {
			t.Fatal("reflex uds did not start")
		}
	}
	ctx := context.Background()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if readyPid(c) != server.Process.Pid {
		t.Fatalf("ready pid %d, server pid %d", readyPid(c), server.Process.Pid)
	}
	s, err := c.Stream(ctx, GenerateRequest{Prompt: "Hello", MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	for s.Next() {
	}
	if s.Err() != nil || s.Result() == nil {
		t.Fatal(s.Err())
	}
	s, err = c.Stream(ctx, long)
	if err != nil || !s.Next() {
		t.Fatal(err)
	}
	s.Close() // closes the connection: the server cancels, the next call reconnects
	if _, err := c.Generate(ctx, GenerateRequest{Prompt: "Hi", MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = c.Generate(tctx, long)
	wantKind(t, err, "cancelled", "")
	if tk, err := c.Tokenize(ctx, TokenizeRequest{Text: "Hi"}); err != nil || len(tk.TokenIDs) == 0 {
		t.Fatal(err)
	}
}

func TestPrefixCacheSwitch(t *testing.T) {
	c, ctx := shared(t), context.Background()
	long := strings.Repeat("word ", 200)
	no := false
	g, err := c.Generate(ctx, GenerateRequest{Prompt: long, MaxTokens: 1, DecodeOptions: DecodeOptions{PrefixCache: &no}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := g.Timings["prefix_cache_tokens"]; ok {
		t.Fatalf("prefix_cache false still read the cache: %v", g.Timings)
	}
	s, err := c.System1(ctx, System1Request{Prompt: long, Candidates: []string{" a", " b"}, PrefixCache: &no})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Timings["prefix_cache_tokens"]; ok {
		t.Fatalf("prefix_cache false still read the cache: %v", s.Timings)
	}
}

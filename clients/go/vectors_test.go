package reflex

// Runs protocol/vectors/*.jsonl cases through the client (see vectors/README.md).
//
// A case whose request is an object with a string op and a valid id goes
// through the public API (Request, or a stream for a streamed generate): the
// client replaces the id with its own, and every line must carry that one.
// Every other case (no id or a null one, whose lines must carry null; lines a
// well-behaved client never writes: not JSON, not an object, no op, an id of
// another type, invalid UTF-8) goes through the client's private exchange,
// verbatim.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

type vectorCase struct {
	Name          string          `json:"name"`
	Request       json.RawMessage `json:"request"`
	RequestBase64 *string         `json:"request_base64"`
	Expect        json.RawMessage `json:"expect"`
}

func vectorFiles() []string {
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(clientsDir()), "protocol", "vectors", "*.jsonl"))
	sort.Strings(files)
	return files
}

// modelUnderTest is the path of the server's default model: what a case's
// "model": "$MODEL" stands for (protocol/vectors/README.md).
func modelUnderTest(ctx context.Context, c *Client) (string, error) {
	ev, err := c.Request(ctx, "load", map[string]any{})
	if err != nil {
		return "", err
	}
	var r struct {
		Path string `json:"path"`
	}
	if err := ev.Decode(&r); err != nil {
		return "", err
	}
	return r.Path, nil
}

// withModel replaces a request object's "model": "$MODEL" with model.
func withModel(req json.RawMessage, model string) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(req, &obj) != nil || string(obj["model"]) != `"$MODEL"` {
		return req, nil
	}
	m, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	obj["model"] = m
	return json.Marshal(obj)
}

func loadCases(path, model string) ([]vectorCase, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []vectorCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var c vectorCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, err
		}
		if c.Request != nil {
			req, err := withModel(c.Request, model)
			if err != nil {
				return nil, err
			}
			c.Request = req
		}
		out = append(out, c)
	}
	return out, sc.Err()
}

func decodeNumbers(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// validID: an id the server echoes, a string or an integer in [-2^63, 2^63).
func validID(raw json.RawMessage) bool {
	v, err := decodeNumbers(raw)
	if err != nil {
		return false
	}
	switch x := v.(type) {
	case string:
		return true
	case json.Number:
		_, err := strconv.ParseInt(string(x), 10, 64)
		return err == nil
	}
	return false
}

func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		fx, _, e1 := big.ParseFloat(string(x), 10, 200, big.ToNearestEven)
		fy, _, e2 := big.ParseFloat(string(y), 10, 200, big.ToNearestEven)
		return e1 == nil && e2 == nil && fx.Cmp(fy) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k := range x {
			if _, ok := y[k]; !ok || !jsonEqual(x[k], y[k]) {
				return false
			}
		}
		return true
	}
	return a == b
}

func dotted(obj any, key string) (any, bool) {
	for _, part := range strings.Split(key, ".") {
		m, ok := obj.(map[string]any)
		if !ok {
			return nil, false
		}
		if obj, ok = m[part]; !ok {
			return nil, false
		}
	}
	return obj, true
}

// collect reads a stream's events, the error result last.
func collect(s *Stream, err error) ([]Event, error) {
	if err != nil {
		return nil, err
	}
	var events []Event
	for s.Next() {
		events = append(events, s.Event())
	}
	if err := s.Err(); err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Response == nil {
			return nil, err
		}
		events = append(events, *e.Response)
	}
	return events, nil
}

// runCase sends the case and checks the response; the problems found (none: pass).
func runCase(ctx context.Context, c *Client, vc vectorCase) ([]string, error) {
	var exp map[string]any
	if v, err := decodeNumbers(vc.Expect); err == nil {
		exp, _ = v.(map[string]any)
	}
	var obj map[string]json.RawMessage
	isObj := len(vc.Request) > 0 && json.Unmarshal(vc.Request, &obj) == nil && obj != nil
	var op string
	hasOp := isObj && json.Unmarshal(obj["op"], &op) == nil && len(obj["op"]) > 0 && obj["op"][0] == '"'
	var events []Event
	var want json.RawMessage
	var err error
	if hasOp && validID(obj["id"]) {
		params := map[string]json.RawMessage{}
		for k, v := range obj {
			if k != "id" && k != "op" {
				params[k] = v
			}
		}
		stream := op == "generate" && string(params["stream"]) == "true"
		if stream {
			delete(params, "stream")
		}
		events, err = collect(c.start(ctx, op, params, stream))
		want = json.RawMessage(strconv.FormatInt(c.nextID, 10))
		if e, ok := exp["id"]; ok {
			if own, _ := decodeNumbers(obj["id"]); !jsonEqual(e, own) {
				want, _ = json.Marshal(e)
			}
		}
	} else {
		var line []byte
		var s string
		switch {
		case vc.RequestBase64 != nil:
			line, err = base64.StdEncoding.DecodeString(*vc.RequestBase64)
		case json.Unmarshal(vc.Request, &s) == nil:
			line = []byte(s)
		default:
			line = vc.Request
		}
		if err != nil {
			return nil, err
		}
		want = json.RawMessage("null")
		if isObj && validID(obj["id"]) {
			want = obj["id"]
		}
		if e, ok := exp["id"]; ok {
			want, _ = json.Marshal(e)
		}
		events, err = collect(c.exchange(ctx, "raw", func(int64) ([]byte, json.RawMessage) {
			return append(append([]byte(nil), line...), '\n'), want
		}))
	}
	if err != nil {
		return nil, err
	}
	return checkCase(events, exp, want), nil
}

func checkCase(events []Event, exp map[string]any, want json.RawMessage) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	last := events[len(events)-1]
	resultAny, _ := decodeNumbers(last.Raw)
	result, _ := resultAny.(map[string]any)
	for _, ev := range events {
		if !sameID(ev.ID, want) {
			fail("line with id %s, want %s", ev.ID, want)
		}
	}
	var text strings.Builder
	for _, ev := range events[:len(events)-1] {
		var tok struct {
			TokenID *int    `json:"token_id"`
			Text    *string `json:"text"`
		}
		if ev.Event != "token" || json.Unmarshal(ev.Raw, &tok) != nil || tok.TokenID == nil || tok.Text == nil {
			fail("not a token line: %s", ev.Raw)
			continue
		}
		text.WriteString(*tok.Text)
	}
	if last.Event != "result" {
		fail("last line is not a result: %s", last.Raw)
	}
	if ok, _ := exp["ok"].(bool); last.OK != ok {
		fail("ok is %v, want %v: %.300s", last.OK, ok, last.Raw)
	}
	errKind, errMsg := "", ""
	if last.Error != nil {
		errKind, errMsg = last.Error.Kind, last.Error.Message
	}
	if k, ok := exp["error_kind"]; ok && errKind != k {
		fail("error kind %q, want %q", errKind, k)
	}
	if m, ok := exp["message_contains"].(string); ok && !strings.Contains(errMsg, m) {
		fail("error message %q lacks %q", errMsg, m)
	}
	if fields, ok := exp["fields"].([]any); ok {
		for _, f := range fields {
			if _, ok := dotted(result, f.(string)); !ok {
				fail("result lacks %s", f)
			}
		}
	}
	if values, ok := exp["values"].(map[string]any); ok {
		for k, v := range values {
			if got, ok := dotted(result, k); !ok || !jsonEqual(got, v) {
				fail("%s is %v, want %v", k, got, v)
			}
		}
	}
	nTokens := len(events) - 1
	if t, ok := exp["tokens"].(bool); ok {
		if t && (nTokens == 0 || text.String() != result["text"]) {
			fail("token lines %q do not spell the text %q", text.String(), result["text"])
		}
		if !t && nTokens > 0 {
			fail("%d token lines, want none", nTokens)
		}
	}
	for _, k := range []string{"timings.total", "timings.parse"} {
		if v, ok := dotted(result, k); !ok {
			fail("%s missing", k)
		} else if _, isNum := v.(json.Number); !isNum {
			fail("%s is not a number", k)
		}
	}
	if op, ok := result["op"]; !ok {
		fail("op missing")
	} else if _, isStr := op.(string); !isStr && op != nil {
		fail("op is not a string or null")
	}
	return bad
}

// Package reflex is a thin, dependency-free client for the reflex protocol
// (protocol/PROTOCOL.md): spawn `reflex stdio` or dial `reflex uds PATH`,
// send one request at a time, read its events.
package reflex

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
)

// ProtocolVersion is the protocol this client speaks (the ready line's "protocol").
const ProtocolVersion = 1

const resignalEvery = 250 * time.Millisecond

// Error is an error result of the protocol; Kind is the protocol's error kind.
// Client-side failures (server not started, gone, unreachable) have Kind
// "connection"; a cancelled context gives Kind "cancelled" and unwraps to
// ctx.Err().
type Error struct {
	Kind     string
	Message  string
	Response *Event // the result line, when the server sent one
	cause    error
}

func (e *Error) Error() string { return e.Kind + ": " + e.Message }
func (e *Error) Unwrap() error { return e.cause }

// Kind returns the protocol kind of err ("" when err is not a *Error).
func Kind(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

func connErr(msg string) error { return &Error{Kind: "connection", Message: msg} }

// ErrorBody is the "error" member of a failed result.
type ErrorBody struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// Event is one server line. The fields common to all events are decoded;
// Raw holds the whole line, and Decode reads the op-specific members.
type Event struct {
	Event   string          `json:"event"`
	ID      json.RawMessage `json:"id"`
	Op      string          `json:"op,omitempty"`
	OK      bool            `json:"ok"`
	Error   *ErrorBody      `json:"error,omitempty"`
	TokenID int             `json:"token_id"` // token events
	Text    string          `json:"text"`     // token events (and generate results)
	// ReasoningContent: a token event's reasoning text (a reasoning model's <think> block).
	ReasoningContent string          `json:"reasoning_content,omitempty"`
	Index            int             `json:"index"`    // a token event's choice (requests with n > 1)
	Protocol         int             `json:"protocol"` // the ready event
	Raw              json.RawMessage `json:"-"`
}

// Decode unmarshals the whole line into v (a struct or a map).
func (e Event) Decode(v any) error { return json.Unmarshal(e.Raw, v) }

// TokenLogprobs is a token event's logprobs entry (nil when the request did
// not ask for logprobs, or e is not a token event).
func (e Event) TokenLogprobs() *LogprobEntry {
	if e.Event != "token" {
		return nil
	}
	var v struct {
		Logprobs *LogprobEntry `json:"logprobs"`
	}
	if json.Unmarshal(e.Raw, &v) != nil {
		return nil
	}
	return v.Logprobs
}

// Options configures Spawn.
type Options struct {
	Command       string        // default "reflex"
	Args          []string      // default ["stdio"]
	Env           []string      // nil: this process's environment
	Dir           string        // working directory
	Stderr        io.Writer     // nil: the last 4 KiB are kept for error messages
	ReadyTimeout  time.Duration // default 60 s
	CloseTimeout  time.Duration // default 5 s: Close kills the server after this
	CancelTimeout time.Duration // default 10 s: a server that does not answer a cancellation is killed
}

// Client is one server connection. Safe for concurrent use: requests are
// sent one at a time, callers served in arrival order. A server that died is
// reported (Kind "connection") and replaced on the next call.
type Client struct {
	open          func(context.Context) (*conn, error)
	turn          chan struct{} // a FIFO lock: blocked senders are served in order
	closeTimeout  time.Duration
	cancelTimeout time.Duration

	mu     sync.Mutex
	conn   *conn
	closed bool
	nextID int64
}

// Spawn starts a server speaking the protocol on stdio and waits for its ready line.
func Spawn(ctx context.Context, opts Options) (*Client, error) {
	if opts.Command == "" {
		opts.Command = "reflex"
	}
	if opts.Args == nil {
		opts.Args = []string{"stdio"}
	}
	ready := orDefault(opts.ReadyTimeout, 60*time.Second)
	c := newClient(func(ctx context.Context) (*conn, error) {
		cn, err := startChild(opts)
		if err != nil {
			return nil, err
		}
		return cn, cn.waitReady(ctx, ready)
	}, opts.CloseTimeout, opts.CancelTimeout)
	return c, c.connect(ctx)
}

// Dial connects to `reflex uds PATH` and waits for the connection's ready line.
func Dial(ctx context.Context, path string) (*Client, error) {
	c := newClient(func(ctx context.Context) (*conn, error) {
		cn, err := dialSocket(ctx, path)
		if err != nil {
			return nil, err
		}
		return cn, cn.waitReady(ctx, 60*time.Second)
	}, 0, 0)
	return c, c.connect(ctx)
}

func newClient(open func(context.Context) (*conn, error), closeT, cancelT time.Duration) *Client {
	return &Client{open: open, turn: make(chan struct{}, 1),
		closeTimeout: orDefault(closeT, 5*time.Second), cancelTimeout: orDefault(cancelT, 10*time.Second)}
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (c *Client) connect(ctx context.Context) error {
	cn, err := c.open(ctx)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.conn = cn
	c.mu.Unlock()
	return nil
}

// Ready returns the ready event of the current connection.
func (c *Client) Ready() Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return Event{}
	}
	return c.conn.ready
}

// Close ends the server's stdin, waits up to CloseTimeout for it to exit,
// then kills it (a socket connection is closed).
func (c *Client) Close() error {
	c.mu.Lock()
	cn := c.conn
	c.conn, c.closed = nil, true
	c.mu.Unlock()
	if cn != nil {
		cn.close(c.closeTimeout)
	}
	return nil
}

// Request sends one request (params: a struct or map whose members are
// merged with id and op) and returns its result; an error result is an *Error.
func (c *Client) Request(ctx context.Context, op string, params any) (*Event, error) {
	s, err := c.start(ctx, op, params, false)
	if err != nil {
		return nil, err
	}
	for s.Next() {
	}
	return s.Result(), s.Err()
}

// Stream is one streamed request: Next advances to each event (the token
// events, then the result); Err reports how it ended. Close it (defer
// s.Close()) to cancel early and free the connection.
type Stream struct {
	c       *Client
	cn      *conn
	ctx     context.Context
	rid     json.RawMessage
	ev      Event
	result  *Event
	err     error
	done    bool
	release sync.Once
}

func (c *Client) start(ctx context.Context, op string, params any, stream bool) (*Stream, error) {
	body, err := encodeRequest(op, params, stream)
	if err != nil {
		return nil, err
	}
	return c.exchange(ctx, op, func(rid int64) ([]byte, json.RawMessage) {
		id := strconv.FormatInt(rid, 10)
		return append([]byte(`{"id":`+id+`,`), body[1:]...), json.RawMessage(id)
	})
}

// exchange sends lineFor(rid) -> (the line, the id its response carries) and
// returns the Stream of its events.
func (c *Client) exchange(ctx context.Context, what string, lineFor func(int64) ([]byte, json.RawMessage)) (*Stream, error) {
	if ctx.Err() != nil {
		return nil, &Error{Kind: "cancelled", Message: what + " cancelled before it was sent", cause: ctx.Err()}
	}
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, &Error{Kind: "cancelled", Message: what + " cancelled while waiting for the connection", cause: ctx.Err()}
	}
	s := &Stream{c: c, ctx: ctx}
	fail := func(err error) (*Stream, error) {
		s.finish()
		return nil, err
	}
	c.mu.Lock()
	closed, cn := c.closed, c.conn
	c.nextID++
	rid := c.nextID
	c.mu.Unlock()
	if closed {
		return fail(connErr("the client is closed"))
	}
	if cn == nil || cn.dead() {
		if err := c.connect(ctx); err != nil {
			return fail(err)
		}
		c.mu.Lock()
		cn = c.conn
		c.mu.Unlock()
	}
	line, id := lineFor(rid)
	s.cn, s.rid = cn, id
	if err := cn.send(line); err != nil {
		return fail(err)
	}
	return s, nil
}

func encodeRequest(op string, params any, stream bool) ([]byte, error) {
	members := map[string]json.RawMessage{}
	if params != nil {
		raw, err := json.Marshal(params)
		if err != nil {
			return nil, fmt.Errorf("reflex: encoding %s params: %w", op, err)
		}
		if string(raw) != "null" {
			if err := json.Unmarshal(raw, &members); err != nil {
				return nil, fmt.Errorf("reflex: %s params must encode to a JSON object: %w", op, err)
			}
		}
	}
	delete(members, "id")
	members["op"], _ = json.Marshal(op)
	if stream {
		members["stream"] = json.RawMessage("true")
	}
	body, err := json.Marshal(members)
	return append(body, '\n'), err
}

// endsRequest: the result that ends request rid (a result whose id is null
// answers the one request in flight: line_too_long cannot echo it).
func endsRequest(ev Event, rid json.RawMessage) bool {
	id := string(ev.ID)
	return ev.Event == "result" && (id == "" || id == "null" || sameID(ev.ID, rid))
}

// sameID compares two JSON ids (an integer or a string) by value.
func sameID(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	da, db := json.NewDecoder(bytes.NewReader(a)), json.NewDecoder(bytes.NewReader(b))
	da.UseNumber()
	db.UseNumber()
	return da.Decode(&x) == nil && db.Decode(&y) == nil && x == y
}

// Next advances to the next event of this request; false once the result has
// been read (or on an error: see Err).
func (s *Stream) Next() bool {
	if s.done {
		return false
	}
	for {
		select {
		case ev, ok := <-s.cn.events:
			if !ok {
				s.err = s.cn.err
				s.finish()
				return false
			}
			if endsRequest(ev, s.rid) {
				s.finish()
				if !ev.OK {
					e := &Error{Kind: "internal", Response: &ev}
					if ev.Error != nil {
						e.Kind, e.Message = ev.Error.Kind, ev.Error.Message
					}
					s.err = e
					return false
				}
				s.ev, s.result = ev, &ev
				return true
			}
			if sameID(ev.ID, s.rid) {
				s.ev = ev
				return true
			}
		case <-s.ctx.Done():
			s.cancel()
			s.err = &Error{Kind: "cancelled", Message: "request cancelled: " + s.ctx.Err().Error(), cause: s.ctx.Err()}
			return false
		}
	}
}

// Event is the event Next advanced to.
func (s *Stream) Event() Event { return s.ev }

// Result is the result event, once Next has read it (nil before, or on error).
func (s *Stream) Result() *Event { return s.result }

// Err is the error that ended the stream (nil after a successful result).
func (s *Stream) Err() error { return s.err }

// Close cancels the request if its result has not been read, and frees the connection.
func (s *Stream) Close() error {
	if !s.done {
		s.cancel()
		if s.err == nil {
			s.err = &Error{Kind: "cancelled", Message: "stream closed before its result"}
		}
	}
	return nil
}

// cancel interrupts the request in flight and drains up to its result, so the
// connection can serve the next request; a server that does not answer in
// CancelTimeout is killed (and restarted on the next call).
func (s *Stream) cancel() {
	defer s.finish()
	deadline := time.NewTimer(s.c.cancelTimeout)
	defer deadline.Stop()
	// SIGINT again until the result comes: one that reached the server before
	// it read the request line was ignored (idle); a repeat can only hit the
	// request being cancelled.
	resignal := time.NewTicker(resignalEvery)
	defer resignal.Stop()
	for !s.cn.dead() {
		s.cn.interrupt()
		select {
		case ev, ok := <-s.cn.events:
			if !ok || endsRequest(ev, s.rid) {
				return
			}
		case <-resignal.C:
		case <-deadline.C:
			s.cn.abandon()
			return
		}
	}
}

func (s *Stream) finish() {
	s.done = true
	s.release.Do(func() { <-s.c.turn })
}

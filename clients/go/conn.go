package reflex

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// conn is one transport: a spawned child (stdin/stdout) or a Unix socket.
type conn struct {
	where  string
	ready  Event
	events chan Event    // server lines, in order; closed when the server is gone
	gone   chan struct{} // closed when the server is gone; err says why
	err    error

	// child
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	tail   *tailWriter
	// socket
	sock net.Conn

	abandonOnce sync.Once
}

func newConn(where string) *conn {
	return &conn{where: where, events: make(chan Event, 64), gone: make(chan struct{})}
}

func (c *conn) dead() bool {
	select {
	case <-c.gone:
		return true
	default:
		return false
	}
}

// readLines feeds c.events until EOF; then death() says why.
func (c *conn) readLines(r io.Reader, death func() error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 && (err == nil || err == io.EOF) {
			ev, perr := parseEvent(line)
			if perr != nil {
				c.err = perr
				c.abandon()
				break
			}
			c.events <- ev
		}
		if err != nil {
			c.err = death()
			break
		}
	}
	close(c.gone)
	close(c.events)
}

func parseEvent(line []byte) (Event, error) {
	var ev Event
	line = bytes.TrimRight(line, "\r\n")
	if err := json.Unmarshal(line, &ev); err != nil || ev.Event == "" {
		return ev, connErr(fmt.Sprintf("server wrote a line that is not an event: %.200s", line))
	}
	ev.Raw = append(json.RawMessage(nil), line...)
	return ev, nil
}

func startChild(opts Options) (*conn, error) {
	cmd := exec.Command(opts.Command, opts.Args...)
	cmd.Env, cmd.Dir = opts.Env, opts.Dir
	c := newConn(strings.TrimSpace(opts.Command + " " + strings.Join(opts.Args, " ")))
	if opts.Stderr != nil {
		cmd.Stderr = opts.Stderr
	} else {
		c.tail = &tailWriter{max: 4096}
		cmd.Stderr = c.tail
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// Our own pipe for stdout, so that cmd.Wait never closes it under the reader.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, connErr(fmt.Sprintf("cannot start %s: %v", opts.Command, err))
	}
	pw.Close()
	c.cmd, c.stdin, c.exited = cmd, stdin, make(chan struct{})
	c.where = fmt.Sprintf("%s (pid %d)", c.where, cmd.Process.Pid)
	go func() {
		cmd.Wait()
		close(c.exited)
	}()
	go c.readLines(pr, func() error {
		select {
		case <-c.exited:
		case <-time.After(2 * time.Second):
			return connErr(c.where + ": the server closed its stdout")
		}
		what := fmt.Sprintf("exited with status %d", cmd.ProcessState.ExitCode())
		if s := cmd.ProcessState.String(); strings.HasPrefix(s, "signal") {
			what = "was killed by " + s
		}
		msg := c.where + ": the server " + what
		if c.tail != nil {
			if t := strings.TrimSpace(c.tail.String()); t != "" {
				msg += "; stderr:\n" + t
			}
		}
		return connErr(msg)
	})
	return c, nil
}

func dialSocket(ctx context.Context, path string) (*conn, error) {
	var d net.Dialer
	sock, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, connErr(fmt.Sprintf("cannot connect to %s: %v", path, err))
	}
	c := newConn("uds " + path)
	c.sock = sock
	go c.readLines(sock, func() error { return connErr(c.where + ": connection closed by the server") })
	return c, nil
}

func (c *conn) waitReady(ctx context.Context, timeout time.Duration) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var err error
	select {
	case ev, ok := <-c.events:
		switch {
		case !ok:
			err = c.err
		case ev.Event != "ready":
			err = connErr(fmt.Sprintf("%s: first line is not the ready event: %.200s", c.where, ev.Raw))
		case ev.Protocol != ProtocolVersion:
			err = connErr(fmt.Sprintf("%s: server speaks protocol %d, this client speaks %d", c.where, ev.Protocol, ProtocolVersion))
		default:
			c.ready = ev
			return nil
		}
	case <-timer.C:
		err = connErr(fmt.Sprintf("%s: no ready line within %v", c.where, timeout))
	case <-ctx.Done():
		err = &Error{Kind: "cancelled", Message: "cancelled while waiting for the ready line", cause: ctx.Err()}
	}
	c.abandon()
	return err
}

func (c *conn) send(line []byte) error {
	var err error
	if c.sock != nil {
		_, err = c.sock.Write(line)
	} else {
		_, err = c.stdin.Write(line)
	}
	if err != nil {
		<-c.gone
		return c.err
	}
	return nil
}

// interrupt cancels the request in flight: SIGINT to a child (it keeps
// serving); a socket is closed (the server cancels a request whose client left).
func (c *conn) interrupt() {
	if c.cmd != nil {
		c.cmd.Process.Signal(os.Interrupt)
	} else {
		c.abandon()
	}
}

func (c *conn) abandon() {
	c.abandonOnce.Do(func() {
		if c.sock != nil {
			c.sock.Close()
		} else {
			c.cmd.Process.Kill()
		}
	})
}

// close: stdin EOF (the server finishes and exits 0), wait up to grace, kill.
func (c *conn) close(grace time.Duration) {
	if c.sock != nil {
		c.abandon()
		return
	}
	c.stdin.Close()
	select {
	case <-c.exited:
	case <-time.After(grace):
		c.abandon()
		<-c.exited
	}
}

// tailWriter keeps the last max bytes written to it (the server's stderr).
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

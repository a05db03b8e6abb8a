package reflex

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fault injection against the fake server (testdata/fake_server.py).

func wantKind(t *testing.T, err error, kind, substr string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want a %s error, got nil", kind)
	}
	if Kind(err) != kind || !strings.Contains(err.Error(), substr) {
		t.Fatalf("want kind %q containing %q, got %v (kind %q)", kind, substr, err, Kind(err))
	}
}

func TestReadyTimeout(t *testing.T) {
	opts := fakeServer("no_ready", "0.05")
	opts.ReadyTimeout = 500 * time.Millisecond
	t0 := time.Now()
	_, err := Spawn(context.Background(), opts)
	wantKind(t, err, "connection", "no ready line")
	if time.Since(t0) > 5*time.Second {
		t.Fatal("ready timeout not honoured")
	}
}

func TestFirstLineMustBeReady(t *testing.T) {
	_, err := Spawn(context.Background(), fakeServer("bad_ready", "0.05"))
	wantKind(t, err, "connection", "not the ready event")
}

func TestExitBeforeReady(t *testing.T) {
	_, err := Spawn(context.Background(), fakeServer("exit_early", "0.05"))
	wantKind(t, err, "connection", "status 3")
	wantKind(t, err, "connection", "cannot start")
}

func TestMissingCommand(t *testing.T) {
	_, err := Spawn(context.Background(), Options{Command: "/nonexistent/reflex"})
	wantKind(t, err, "connection", "cannot start")
}

func TestDeadChildRestarted(t *testing.T) {
	ctx := context.Background()
	c, err := Spawn(ctx, fakeServer("", "0.05"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var pid struct{ Pid int }
	c.Ready().Decode(&pid)
	_, err = c.Request(ctx, "die", nil)
	wantKind(t, err, "connection", "status 7")
	if _, err := c.Request(ctx, "ping", nil); err != nil {
		t.Fatal(err)
	}
	var pid2 struct{ Pid int }
	c.Ready().Decode(&pid2)
	if pid2.Pid == pid.Pid || pid2.Pid == 0 {
		t.Fatalf("not restarted: pid %d -> %d", pid.Pid, pid2.Pid)
	}
}

func TestContextCancelSendsSIGINT(t *testing.T) {
	c, err := Spawn(context.Background(), fakeServer("", "0.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Request(ctx, "generate", map[string]any{"prompt": "abcdefghijklmnop"})
	wantKind(t, err, "cancelled", "deadline")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error does not unwrap to the context's: %v", err)
	}
	ev, err := c.Request(context.Background(), "generate", map[string]any{"prompt": "ok"})
	if err != nil || ev.Text != "ok" {
		t.Fatalf("after cancel: %v %+v", err, ev)
	}
	// a stream closed early
	s, err := c.start(context.Background(), "generate", map[string]any{"prompt": "abcdefgh"}, true)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Next() || s.Event().Event != "token" {
		t.Fatalf("want a token event: %v", s.Err())
	}
	s.Close()
	wantKind(t, s.Err(), "cancelled", "closed")
	ev, err = c.Request(context.Background(), "generate", map[string]any{"prompt": "ok"})
	if err != nil || ev.Text != "ok" {
		t.Fatalf("after close: %v %+v", err, ev)
	}
}

func TestFIFO(t *testing.T) {
	c, err := Spawn(context.Background(), fakeServer("", "0.01"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		p := string(rune('a' + i))
		go func() {
			defer wg.Done()
			ev, err := c.Request(context.Background(), "generate", map[string]any{"prompt": p})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, ev.Text)
			mu.Unlock()
		}()
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	if strings.Join(order, "") != "abcdefgh" {
		t.Fatalf("not FIFO: %v", order)
	}
}

func TestClosedClientRefuses(t *testing.T) {
	c, err := Spawn(context.Background(), fakeServer("", "0.05"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	_, err = c.Request(context.Background(), "ping", nil)
	wantKind(t, err, "connection", "closed")
}

func TestCloseKillsStubbornChild(t *testing.T) {
	c, err := Spawn(context.Background(), Options{Command: "sh", Args: []string{"-c",
		`echo '{"event":"ready","id":null,"protocol":1}'; trap "" INT; exec sleep 60`},
		CloseTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c.Close()
	if time.Since(t0) > 5*time.Second {
		t.Fatal("close did not kill the child")
	}
}

func TestContextCoversTheWaitInTheQueue(t *testing.T) {
	c, err := Spawn(context.Background(), fakeServer("", "0.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := make(chan *Event, 1)
	go func() {
		ev, _ := c.Request(context.Background(), "generate", map[string]any{"prompt": "abcdefgh"})
		first <- ev
	}()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.Request(ctx, "generate", map[string]any{"prompt": "x"})
	wantKind(t, err, "cancelled", "while waiting")
	if ev := <-first; ev == nil || ev.Text != "abcdefgh" {
		t.Fatalf("the first request: %+v", ev)
	}
}

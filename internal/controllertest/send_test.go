package controllertest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

func dial(t *testing.T, broker, gw string) *controller.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := controller.Dial(ctx, controller.ConnOptions{Broker: broker, Gateway: gw})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSendResults(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	const fence = 40
	cases := []struct {
		name      string
		script    script
		wantErr   error
		wantCode  wire.Code
		wantPubs  int
		wantStats controller.SendStats
		wantLost  bool
	}{
		{
			name: "applied",
			script: func(c wire.Command, _ int) []delayed {
				return []delayed{{0, result(c, wire.CodeOK, fence)}}
			},
			wantCode: wire.CodeOK, wantPubs: 1, wantStats: controller.SendStats{Published: 1},
		},
		{
			name: "timeout resends the same op_id",
			script: func(c wire.Command, seen int) []delayed {
				if seen == 0 {
					return nil // the Result is lost
				}
				return []delayed{{0, result(c, wire.CodeOK, fence)}}
			},
			wantCode: wire.CodeOK, wantPubs: 2, wantStats: controller.SendStats{Published: 2, Resends: 1},
		},
		{
			name: "busy is retried",
			script: func(c wire.Command, seen int) []delayed {
				if seen < 2 {
					return []delayed{{0, result(c, wire.CodeBusy, fence)}}
				}
				return []delayed{{0, result(c, wire.CodeOK, fence)}}
			},
			wantCode: wire.CodeOK, wantPubs: 3, wantStats: controller.SendStats{Published: 3, Busy: 2},
		},
		{
			name: "unknown is not final",
			script: func(c wire.Command, _ int) []delayed {
				return []delayed{{0, result(c, wire.CodeOutcomeUnknown, fence)}, {300 * time.Millisecond, result(c, wire.CodeOK, fence)}}
			},
			wantCode: wire.CodeOK, wantPubs: 1, wantStats: controller.SendStats{Published: 1, Unknown: 1},
		},
		{
			name: "policy denied is final",
			script: func(c wire.Command, _ int) []delayed {
				return []delayed{{0, result(c, wire.CodePolicyDenied, fence)}}
			},
			wantErr: controller.ErrNotApplied, wantCode: wire.CodePolicyDenied, wantPubs: 1, wantStats: controller.SendStats{Published: 1},
		},
		{
			name: "stale fence loses ownership",
			script: func(c wire.Command, _ int) []delayed {
				return []delayed{{0, result(c, wire.CodeStaleFence, fence+5)}}
			},
			wantErr: controller.ErrLost, wantCode: wire.CodeStaleFence, wantPubs: 1, wantStats: controller.SendStats{Published: 1}, wantLost: true,
		},
		{
			name: "a newer last_fence on a replay loses ownership",
			script: func(c wire.Command, _ int) []delayed {
				r := result(c, wire.CodeOK, fence+1)
				r.Duplicate = true
				return []delayed{{0, r}}
			},
			wantErr: controller.ErrNewerFence, wantCode: wire.CodeOK, wantPubs: 1, wantStats: controller.SendStats{Published: 1}, wantLost: true,
		},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gw := "gw-send-" + string(rune('a'+i))
			rs := startResponder(t, broker, gw, tc.script)
			conn := dial(t, broker, gw)
			owner := &controller.FixedFence{Fence: fence, Lock: "locks/x", Holder: "t"}
			s := controller.NewSender(conn, owner, &controller.SendOptions{ResultTimeout: 400 * time.Millisecond, BackoffBase: 20 * time.Millisecond})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := s.Send(ctx, "pump-7", "set", map[string]any{"rpm": 1200})
			if tc.wantErr == nil && err != nil {
				t.Fatalf("send: %v", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("send: got %v, want %v", err, tc.wantErr)
			}
			if notApplied := errors.Is(err, controller.ErrNotApplied); notApplied != (err != nil && r.Status != wire.StatusApplied) {
				t.Fatalf("send: %v wraps ErrNotApplied = %v for status %s", err, notApplied, r.Status)
			}
			if r.Code != tc.wantCode {
				t.Fatalf("result code %q, want %q", r.Code, tc.wantCode)
			}
			seen := rs.seen()
			if len(seen) != tc.wantPubs {
				t.Fatalf("responder saw %d commands, want %d", len(seen), tc.wantPubs)
			}
			for _, c := range seen {
				if c.cmd.OpID != seen[0].cmd.OpID || c.cmd.Fence != fence || c.cmd.ReplyTo != conn.ReplyTopic() || c.cmd.Lock != "locks/x" {
					t.Fatalf("command %+v: want op_id %s, fence %d, reply_to %s", c.cmd, seen[0].cmd.OpID, fence, conn.ReplyTopic())
				}
			}
			if got := s.Stats(); got != tc.wantStats {
				t.Fatalf("stats %+v, want %+v", got, tc.wantStats)
			}
			if lost := owner.Check() != nil; lost != tc.wantLost {
				t.Fatalf("owner lost = %v, want %v", lost, tc.wantLost)
			}
			if tc.wantLost {
				// A LOST owner sends nothing more.
				if _, err := s.Send(ctx, "pump-7", "stop", nil); !errors.Is(err, controller.ErrLost) {
					t.Fatalf("send after LOST: %v, want ErrLost", err)
				}
				if n := len(rs.seen()); n != tc.wantPubs {
					t.Fatalf("send after LOST published: responder saw %d commands", n)
				}
			}
		})
	}
}

func TestSendLostWhileWaitingStopsResends(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	rs := startResponder(t, broker, "gw-lw", func(wire.Command, int) []delayed { return nil })
	conn := dial(t, broker, "gw-lw")
	owner := &controller.FixedFence{Fence: 3}
	s := controller.NewSender(conn, owner, &controller.SendOptions{ResultTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.Send(ctx, "pump-7", "stop", nil)
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "two publishes", func() bool { return len(rs.seen()) >= 2 })
	owner.Lose(errors.New("test"))
	err := <-done
	if !errors.Is(err, controller.ErrLost) {
		t.Fatalf("send: %v, want ErrLost", err)
	}
	n := len(rs.seen())
	// Give a resend every chance to happen (three Result timeouts).
	deadline := time.Now().Add(600 * time.Millisecond)
	for time.Now().Before(deadline) {
		if len(rs.seen()) != n {
			t.Fatalf("a resend went out after LOST")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSendSerialisedPerDevice(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	var mu sync.Mutex
	answered := map[string]time.Time{}
	rs := startResponder(t, broker, "gw-ser", func(c wire.Command, _ int) []delayed {
		// The first command of each device is slow.
		d := time.Duration(0)
		if c.Action == "slow" {
			d = 300 * time.Millisecond
		}
		mu.Lock()
		answered[c.OpID] = time.Now().Add(d)
		mu.Unlock()
		return []delayed{{d, result(c, wire.CodeOK, 9)}}
	})
	conn := dial(t, broker, "gw-ser")
	owner := &controller.FixedFence{Fence: 9}
	// Two Senders of one owner share its per-device order.
	s, s2 := controller.NewSender(conn, owner, nil), controller.NewSender(dial(t, broker, "gw-ser"), owner, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	send := func(s *controller.Sender, dev, action string) {
		defer wg.Done()
		if _, err := s.Send(ctx, dev, action, nil); err != nil {
			errs <- err
		}
	}
	wg.Add(1)
	go send(s, "pump-7", "slow")
	testkit.Eventually(t, 5*time.Second, "the slow command to arrive", func() bool { return len(rs.seen()) == 1 })
	wg.Add(2)
	go send(s2, "pump-7", "fast")
	go send(s, "valve-1", "fast")
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("send: %v", err)
	}
	seen := rs.seen()
	if len(seen) != 3 {
		t.Fatalf("saw %d commands, want 3", len(seen))
	}
	var slow, fastPump, fastValve seenCmd
	for _, c := range seen {
		switch {
		case c.cmd.Action == "slow":
			slow = c
		case deviceOf(c.cmd) == "pump-7":
			fastPump = c
		default:
			fastValve = c
		}
	}
	mu.Lock()
	slowAnswered := answered[slow.cmd.OpID]
	mu.Unlock()
	if fastPump.at.Before(slowAnswered) {
		t.Fatalf("second pump command arrived at %v, before the first had its Result at %v", fastPump.at, slowAnswered)
	}
	if !fastValve.at.Before(slowAnswered) {
		t.Fatalf("another device's command waited for pump-7 (arrived %v, pump result %v)", fastValve.at, slowAnswered)
	}
}

func TestBarrier(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	const fence = 12
	rs := startResponder(t, broker, "gw-bar", func(c wire.Command, _ int) []delayed {
		if c.Action != wire.ActionFence {
			return []delayed{{0, result(c, wire.CodeInvalid, fence)}}
		}
		switch deviceOf(c) {
		case "stale":
			return []delayed{{0, result(c, wire.CodeStaleFence, fence+3)}}
		case "nodev":
			return []delayed{{0, result(c, wire.CodeUnknownDevice, 0)}}
		}
		return []delayed{{0, result(c, wire.CodeOK, fence)}}
	})
	conn := dial(t, broker, "gw-bar")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ok := &controller.FixedFence{Fence: fence}
	if err := controller.NewSender(conn, ok, nil).Barrier(ctx, "pump-7", "valve-1"); err != nil {
		t.Fatalf("barrier: %v", err)
	}
	if n := len(rs.seen()); n != 2 {
		t.Fatalf("barrier sent %d commands, want 2", n)
	}
	bad := &controller.FixedFence{Fence: fence}
	err := controller.NewSender(conn, bad, nil).Barrier(ctx, "pump-7", "nodev")
	if !errors.Is(err, controller.ErrBarrier) || errors.Is(err, controller.ErrLost) {
		t.Fatalf("barrier with unknown device: %v, want ErrBarrier only", err)
	}
	stale := &controller.FixedFence{Fence: fence}
	err = controller.NewSender(conn, stale, nil).Barrier(ctx, "stale")
	if !errors.Is(err, controller.ErrBarrier) || !errors.Is(err, controller.ErrLost) || stale.Check() == nil {
		t.Fatalf("barrier on stale device: %v, owner %v; want ErrBarrier, ErrLost", err, stale.Check())
	}
}

func TestOpIDsUnique(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 10000; i++ {
		id := controller.NewOpID()
		if !wire.ValidOpID(id) || seen[id] {
			t.Fatalf("op_id %q invalid or repeated after %d", id, i)
		}
		seen[id] = true
	}
}

func TestDialUnreachableBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := controller.Dial(ctx, controller.ConnOptions{Broker: "tcp://127.0.0.1:1", Gateway: "gw", ConnectTimeout: time.Second})
	if !errors.Is(err, controller.ErrConnect) {
		t.Fatalf("dial: %v, want ErrConnect", err)
	}
}

func TestSendCommandFields(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	rs := startResponder(t, broker, "gw-fields", func(c wire.Command, _ int) []delayed {
		return []delayed{{0, result(c, wire.CodeOK, c.Fence)}}
	})
	conn := dial(t, broker, "gw-fields")
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 5, Lock: "locks/l", Holder: "ctl-a"}, &controller.SendOptions{ExpiresIn: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now()
	if _, err := s.Send(ctx, "pump-7", "set", json.RawMessage(`{"rpm": 7}`), controller.WithOpID("my-op.1")); err != nil {
		t.Fatal(err)
	}
	got := rs.seen()[0].cmd
	if got.OpID != "my-op.1" || got.Holder != "ctl-a" || got.Lock != "locks/l" || got.Fence != 5 ||
		string(got.Params) != `{"rpm":7}` || got.ExpiresAt == nil || got.ExpiresAt.Before(before.Add(59*time.Second)) {
		t.Fatalf("command %+v", got)
	}
	for _, bad := range []struct {
		dev, action string
		params      any
	}{{"a/b", "set", nil}, {"pump-7", "Set", nil}, {"pump-7", "set", []int{1}}, {"pump-7", "set", json.RawMessage(`{`)},
		{"pump-7", "set", json.RawMessage(`{"rpm":1,"RPM":2}`)}} {
		if _, err := s.Send(ctx, bad.dev, bad.action, bad.params); !errors.Is(err, controller.ErrInvalidCommand) {
			t.Fatalf("send %+v: %v, want ErrInvalidCommand", bad, err)
		}
	}
	if len(rs.seen()) != 1 {
		t.Fatal("an invalid command was published")
	}
}

// OnPublish sees every publish, resends included, after the broker's
// PUBACK (nil error).
func TestSendOnPublish(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	startResponder(t, broker, "gw-onpub", func(c wire.Command, seen int) []delayed {
		if seen == 0 {
			return nil // the Result is lost: Send resends
		}
		return []delayed{{0, result(c, wire.CodeOK, 7)}}
	})
	conn := dial(t, broker, "gw-onpub")
	var mu sync.Mutex
	var got []error
	var ops []string
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 7}, &controller.SendOptions{ResultTimeout: 300 * time.Millisecond,
		OnPublish: func(c wire.Command, err error) {
			mu.Lock()
			got, ops = append(got, err), append(ops, c.OpID)
			mu.Unlock()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Send(ctx, "pump-7", "set", map[string]any{"rpm": 1}, controller.WithOpID("op-onpub")); err != nil {
		t.Fatalf("send: %v", err)
	}
	mu.Lock()
	if len(got) != 2 || got[0] != nil || got[1] != nil || ops[0] != "op-onpub" || ops[1] != "op-onpub" {
		t.Fatalf("OnPublish saw %v for %v, want two nil errors for op-onpub", got, ops)
	}
	mu.Unlock()
}

// A controller whose broker restarts several times in a row is back within
// a few seconds of the last restart: paho's reconnect backoff is capped
// (ConnOptions.MaxReconnectInterval). Uncapped, it doubled with every
// loss soon after the last one, and the chaos campaign's controllers on
// the embedded broker (restarted with the agent) stayed away for tens of
// seconds.
func TestReconnectAfterRepeatedBrokerRestarts(t *testing.T) {
	m := mqtttest.StartMosquitto(t)
	conn := dial(t, m.URL(), "gw-reconnect")
	for i := 0; i < 6; i++ {
		m.Restart()
		testkit.Eventually(t, 30*time.Second, "the controller reconnects", conn.Connected)
	}
	m.Restart()
	start := time.Now()
	testkit.Eventually(t, 30*time.Second, "the controller reconnects", conn.Connected)
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("after the 7th broker restart in a row the controller took %v to reconnect (the cap is 2s)", took)
	}
}

// busy is not final: a Send that gives up on it reports the outcome
// unknown (a resend may have been queued), and every command, signed or
// not, carries expires_at (DefaultExpiry), after which the agent does
// not start it.
func TestSendGivingUpOnBusyIsOutcomeUnknown(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	rs := startResponder(t, broker, "gw-busy", func(c wire.Command, _ int) []delayed {
		return []delayed{{0, result(c, wire.CodeBusy, c.Fence)}}
	})
	conn := dial(t, broker, "gw-busy")
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 3}, &controller.SendOptions{BackoffBase: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	before := time.Now()
	_, err := s.Send(ctx, "pump-7", "set", map[string]int{"rpm": 1})
	var re *controller.ResultError
	if !errors.Is(err, controller.ErrOutcomeUnknown) || errors.Is(err, controller.ErrNotApplied) || errors.As(err, &re) {
		t.Fatalf("send: %v, want controller.ErrOutcomeUnknown and no final rejection", err)
	}
	seen := rs.seen()
	if len(seen) < 2 {
		t.Fatalf("busy was not retried: %d publishes", len(seen))
	}
	exp := seen[0].cmd.ExpiresAt
	if exp == nil || exp.Before(before.Add(controller.DefaultExpiry-time.Second)) || exp.After(time.Now().Add(controller.DefaultExpiry)) {
		t.Fatalf("expires_at %v, want now + %v", exp, controller.DefaultExpiry)
	}
	if !strings.Contains(err.Error(), exp.Format(time.RFC3339Nano)) {
		t.Fatalf("the error %q does not say until when the outcome is unknown", err)
	}
}

// A PUBLISH lost with the connection (held by a proxy, then the
// connection dropped before the broker saw it) is completed once paho has
// reconnected: Send returns the Result, and the command went out under
// one op_id. (A publish whose token fails is sent again by Send itself:
// controller.TestSendResendsAfterAFailedPublish.)
func TestSendPublishLostWithTheConnection(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	rs := startResponder(t, broker, "gw-pl", func(c wire.Command, _ int) []delayed {
		return []delayed{{0, result(c, wire.CodeOK, 7)}}
	})
	px := testkit.NewProxy(t, broker)
	conn := dial(t, px.URL(), "gw-pl")
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 7}, &controller.SendOptions{
		ResultTimeout: 5 * time.Second, BackoffBase: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	px.Pause()
	held := px.Held()
	type sent struct {
		r   wire.Result
		err error
	}
	done := make(chan sent, 1)
	go func() {
		r, err := s.Send(ctx, "pump-7", "set", map[string]any{"rpm": 900})
		done <- sent{r, err}
	}()
	testkit.Eventually(t, 5*time.Second, "the proxy to hold the PUBLISH", func() bool { return px.Held() > held })
	px.Cut()
	// The reconnect is held too: the connection is seen down.
	testkit.Eventually(t, 5*time.Second, "the controller to see its connection lost", func() bool { return !conn.Connected() })
	if n := len(rs.seen()); n != 0 {
		t.Fatalf("the responder saw %d commands through a paused proxy", n)
	}
	px.Resume()
	out := <-done
	if out.err != nil || out.r.Code != wire.CodeOK {
		t.Fatalf("send: %+v, %v; want ok", out.r, out.err)
	}
	seen := rs.seen()
	if len(seen) == 0 {
		t.Fatal("the responder saw no command")
	}
	for _, c := range seen {
		if c.cmd.OpID != out.r.OpID {
			t.Fatalf("the responder saw op_id %s, want only %s", c.cmd.OpID, out.r.OpID)
		}
	}
}

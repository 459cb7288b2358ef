package controller

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// doneToken is a paho.Token that has completed, with err.
type doneToken struct{ err error }

func (t doneToken) Wait() bool                     { return true }
func (t doneToken) WaitTimeout(time.Duration) bool { return true }
func (t doneToken) Done() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}
func (t doneToken) Error() error { return t.err }

// result is a paho.Message on the reply topic.
type result struct {
	topic   string
	payload []byte
}

func (m result) Duplicate() bool   { return false }
func (m result) Qos() byte         { return 1 }
func (m result) Retained() bool    { return false }
func (m result) Topic() string     { return m.topic }
func (m result) MessageID() uint16 { return 1 }
func (m result) Payload() []byte   { return m.payload }
func (m result) Ack()              {}

// failingClient is the one fault a broker cannot be made to produce on
// demand: paho completing a PUBLISH token with an error (as it did when a
// NATS node dropped a controller mid-publish, e2e.TestFleetOnNATSCluster).
// Its first fails publishes fail; the others are answered ok on the
// Conn's reply topic, as an agent would. Only what Send calls is
// implemented (the embedded interface is nil).
type failingClient struct {
	paho.Client
	conn  *Conn
	fails int

	mu   sync.Mutex
	pubs []wire.Command
}

func (f *failingClient) Subscribe(string, byte, paho.MessageHandler) paho.Token {
	return doneToken{}
}

func (f *failingClient) Publish(topic string, _ byte, _ bool, payload any) paho.Token {
	cmd, err := wire.ParseCommand(payload.([]byte))
	if err != nil {
		return doneToken{err}
	}
	f.mu.Lock()
	f.pubs = append(f.pubs, cmd)
	n := len(f.pubs)
	f.mu.Unlock()
	if n <= f.fails {
		return doneToken{errors.New("connection lost before Publish completed")}
	}
	dev, _ := wire.DeviceFromCmdTopic(wire.DefaultPrefix, "gw", topic)
	b, _ := json.Marshal(wire.Result{V: wire.Version, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
		Status: wire.StatusApplied, Code: wire.CodeOK, LastFence: cmd.Fence, At: time.Now().UTC()})
	go f.conn.onMessage(nil, result{f.conn.reply, b})
	return doneToken{}
}

func newFailingConn(fails int) (*Conn, *failingClient) {
	c := &Conn{opts: ConnOptions{Gateway: "gw", Prefix: wire.DefaultPrefix, ControllerID: "ctl-test"},
		waiters: map[string]waiter{}, watched: map[string]bool{}}
	c.reply = ReplyTopic(c.opts.Prefix, c.opts.Gateway, c.opts.ControllerID)
	f := &failingClient{conn: c, fails: fails}
	c.cli = f
	return c, f
}

// Send sends a command again, same op_id, after a publish that failed
// with the connection, and returns the Result of the one that went
// through (invariant 2: the agent answers a resend from its record).
func TestSendResendsAfterAFailedPublish(t *testing.T) {
	conn, f := newFailingConn(2)
	var pubErrs []error
	s := NewSender(conn, &FixedFence{Fence: 4}, &SendOptions{BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond,
		OnPublish: func(_ wire.Command, err error) { pubErrs = append(pubErrs, err) }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Send(ctx, "pump-7", "set", map[string]any{"rpm": 900})
	if err != nil || r.Code != wire.CodeOK {
		t.Fatalf("send: %+v, %v; want ok", r, err)
	}
	if len(f.pubs) != 3 {
		t.Fatalf("%d publishes, want 3 (two failed, one answered)", len(f.pubs))
	}
	for _, c := range f.pubs {
		if c.OpID != r.OpID || c.Fence != 4 {
			t.Fatalf("publish %+v: want op_id %s, fence 4", c, r.OpID)
		}
	}
	if len(pubErrs) != 3 || !errors.Is(pubErrs[0], ErrPublish) || !errors.Is(pubErrs[1], ErrPublish) || pubErrs[2] != nil {
		t.Fatalf("OnPublish saw %v; want ErrPublish twice, then nil", pubErrs)
	}
	if st := s.Stats(); st.Resends != 2 || st.Published != 1 {
		t.Fatalf("stats %+v, want Resends 2 (the failed publishes) and Published 1", st)
	}
}

// While every publish fails, Send keeps trying until ctx ends, then says
// the outcome is unknown (a publish may have reached the broker) wrapping
// ErrPublish.
func TestSendGivesUpOnFailedPublishesWithCtx(t *testing.T) {
	conn, f := newFailingConn(1 << 30)
	s := NewSender(conn, &FixedFence{Fence: 4}, &SendOptions{BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := s.Send(ctx, "pump-7", "set", map[string]any{"rpm": 900})
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrPublish) {
		t.Fatalf("send: %v; want ErrOutcomeUnknown wrapping ErrPublish", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pubs) < 2 {
		t.Fatalf("%d publishes before ctx ended; want it tried again", len(f.pubs))
	}
}

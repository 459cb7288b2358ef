package mqtt

// The four mochi-mqtt v2.7.9 defects that sessionHook works around, and a
// fifth it does not (docs/mochi.md), each reproduced twice with a real
// paho client: against plain upstream mochi with its own bbolt hook, where
// the test asserts that the defect shows (so it fails, and says so, the
// day an upgrade of mochi fixes it: then the workaround can go), and
// against the same broker with sessionHook, where the message arrives as
// it must (defect 5: where it arrives only after a restart).

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/hooks/storage/bolt"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.etcd.io/bbolt"

	"github.com/edge-agent/edge-agent/internal/testkit"
)

// defectBroker is a mochi server on a fixed address and store, which a
// test can stop and start again.
type defectBroker struct {
	t     *testing.T
	addr  string
	path  string
	fixed bool         // with sessionHook, else mochi's bolt hook alone
	extra []mochi.Hook // probes, added before the others
	srv   *mochi.Server
}

func newDefectBroker(t *testing.T, fixed bool, extra ...mochi.Hook) *defectBroker {
	b := &defectBroker{t: t, addr: fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)),
		path: filepath.Join(t.TempDir(), "broker.db"), fixed: fixed, extra: extra}
	b.start()
	t.Cleanup(b.stop)
	return b
}

func (b *defectBroker) url() string { return "tcp://" + b.addr }

func (b *defectBroker) start() {
	t := b.t
	t.Helper()
	srv := mochi.New(&mochi.Options{Capabilities: EmbeddedCapabilities(),
		Logger: slog.New(minLevel{testHandler(t), slog.LevelWarn})})
	for _, h := range b.extra { // first: a probe that provides OnACLCheck must be asked before AllowHook
		if err := srv.AddHook(h, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	var store mochi.Hook = new(bolt.Hook)
	if b.fixed {
		h := newSessionHook()
		h.srv = srv
		store = h
	}
	if err := srv.AddHook(store, &bolt.Options{Path: b.path, Options: &bbolt.Options{Timeout: 5 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "t", Address: b.addr})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(); err != nil {
		t.Fatal(err)
	}
	b.srv = srv
}

func (b *defectBroker) stop() {
	if b.srv != nil {
		_ = b.srv.Close()
		b.srv = nil
	}
}

// waitInflight waits until the session of client id holds n messages:
// mochi acknowledges a publish before it routes it (defect 4), so the
// publisher's PUBACK does not say that the session has the message yet.
func (b *defectBroker) waitInflight(t *testing.T, id string, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("session %s holds %d messages", id, n), func() bool {
		cl, ok := b.srv.Clients.Get(id)
		return ok && cl.State.Inflight.Len() == n
	})
}

func (b *defectBroker) restart() {
	b.stop()
	b.start()
}

// testHandler sends the broker's log to t.Log.
func testHandler(t *testing.T) slog.Handler {
	return slog.NewTextHandler(tWriter{t}, nil)
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }() // t.Log after the test ended panics
	w.t.Log(string(p))
	return len(p), nil
}

// pahoClient is a real paho client as the agent configures it: a
// persistent session, deliveries in order, manual acknowledgements.
type pahoClient struct {
	paho.Client
	got chan paho.Message
}

func connectPaho(t *testing.T, url, id string) *pahoClient {
	t.Helper()
	c := &pahoClient{got: make(chan paho.Message, 10_000)}
	o := paho.NewClientOptions().AddBroker(url).SetClientID(id).
		SetCleanSession(false).SetOrderMatters(true).SetAutoAckDisabled(true).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) { c.got <- m })
	c.Client = paho.NewClient(o)
	wait(t, "connect "+id, c.Connect())
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

func wait(t *testing.T, what string, tok paho.Token) {
	t.Helper()
	if !tok.WaitTimeout(10 * time.Second) {
		t.Fatalf("%s: no answer within 10s", what)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func (c *pahoClient) subscribe(t *testing.T, topic string) {
	t.Helper()
	wait(t, "subscribe "+topic, c.Subscribe(topic, 1, nil))
}

func (c *pahoClient) publish(t *testing.T, topic, payload string) *paho.PublishToken {
	t.Helper()
	tok := c.Publish(topic, 1, false, payload)
	wait(t, "publish "+payload, tok)
	return tok.(*paho.PublishToken)
}

// receive collects n deliveries, or what arrived within d.
func (c *pahoClient) receive(n int, d time.Duration) []paho.Message {
	var got []paho.Message
	timeout := time.After(d)
	for len(got) < n {
		select {
		case m := <-c.got:
			got = append(got, m)
		case <-timeout:
			return got
		}
	}
	return got
}

func payloads(ms []paho.Message) []string {
	var s []string
	for _, m := range ms {
		s = append(s, string(m.Payload()))
	}
	return s
}

// quiet is how long a test waits for a delivery that the defect prevents.
const quiet = 2 * time.Second

// Defect 1: mochi's bolt hook stores an in-flight message without its
// packet ID. After a restart the session's messages all have ID 0: the
// client is disconnected on the resend and gets nothing.
func TestMochiDefect1PacketIDNotStored(t *testing.T) {
	run := func(t *testing.T, fixed bool) []string {
		b := newDefectBroker(t, fixed)
		sub := connectPaho(t, b.url(), "sub")
		sub.subscribe(t, "cmd")
		sub.Disconnect(0)
		pub := connectPaho(t, b.url(), "pub")
		for i := range 3 {
			pub.publish(t, "cmd", strconv.Itoa(i))
		}
		pub.Disconnect(0)
		b.waitInflight(t, "sub", 3)
		b.restart()
		sub = connectPaho(t, b.url(), "sub")
		return payloads(sub.receive(3, quiet))
	}
	t.Run("upstream", func(t *testing.T) {
		if got := run(t, false); len(got) != 0 {
			t.Fatalf("mochi redelivered %q after a restart: defect 1 is fixed upstream, StoredInflightMessages' packet-ID repair can go", got)
		}
	})
	t.Run("sessionHook", func(t *testing.T) {
		if got := run(t, true); !slices.Equal(got, []string{"0", "1", "2"}) {
			t.Fatalf("after a restart the session got %q, want 0 1 2", got)
		}
	})
}

// Defect 2: mochi resends a session's in-flight messages sorted by
// uint16(Created), Created in seconds: those of the same second come in
// random order after a reconnect.
func TestMochiDefect2ResendOrder(t *testing.T) {
	const n = 200
	want := make([]string, n)
	for i := range n {
		want[i] = strconv.Itoa(i)
	}
	run := func(t *testing.T, fixed bool) []string {
		b := newDefectBroker(t, fixed)
		sub := connectPaho(t, b.url(), "sub")
		sub.subscribe(t, "cmd")
		sub.Disconnect(0)
		pub := connectPaho(t, b.url(), "pub")
		for i := range n {
			pub.publish(t, "cmd", strconv.Itoa(i))
		}
		b.waitInflight(t, "sub", n)
		sub = connectPaho(t, b.url(), "sub")
		return payloads(sub.receive(n, 10*time.Second))
	}
	t.Run("upstream", func(t *testing.T) {
		if got := run(t, false); slices.Equal(got, want) {
			t.Fatalf("mochi resent %d messages in publish order: defect 2 may be fixed upstream, sessionHook's ranking may go", n)
		} else {
			t.Logf("upstream resent %d of %d, out of publish order", len(got), n)
		}
	})
	t.Run("sessionHook", func(t *testing.T) {
		if got := run(t, true); !slices.Equal(got, want) {
			t.Fatalf("resent out of order: %q", got)
		}
	})
}

// Defect 3: mochi keeps both directions' packets in one map keyed by
// packet ID. A client's QoS 1 PUBLISH with the ID of a message delivered
// to it and not yet acknowledged deletes that message: it is never
// redelivered.
func TestMochiDefect3SharedPacketIDs(t *testing.T) {
	// The client's SUBSCRIBE took packet ID 1, so its first PUBLISH takes
	// 2: three deliveries (IDs 1, 2, 3) make sure one of them shares it.
	held := []string{"held-0", "held-1", "held-2"}
	run := func(t *testing.T, fixed bool) (got []string, shared string) {
		b := newDefectBroker(t, fixed)
		sub := connectPaho(t, b.url(), "sub")
		sub.subscribe(t, "cmd")
		pub := connectPaho(t, b.url(), "pub")
		for _, p := range held {
			pub.publish(t, "cmd", p)
		}
		ms := sub.receive(len(held), 10*time.Second)
		if len(ms) != len(held) {
			t.Fatalf("%d of %d deliveries", len(ms), len(held))
		}
		// None acknowledged: the agent holds them while it publishes a Result.
		id := sub.publish(t, "result", "r").MessageID()
		for _, m := range ms {
			if m.MessageID() == id {
				shared = string(m.Payload())
			}
		}
		if shared == "" {
			t.Fatalf("premise: no delivery has the packet ID %d of the client's publish", id)
		}
		sub.Disconnect(0)
		sub = connectPaho(t, b.url(), "sub")
		return payloads(sub.receive(len(held), quiet)), shared
	}
	t.Run("upstream", func(t *testing.T) {
		got, shared := run(t, false)
		if slices.Contains(got, shared) {
			t.Fatalf("mochi redelivered %q (%q shared its packet ID with the client's publish): defect 3 is fixed upstream, sessionHook's stash can go", got, shared)
		}
		t.Logf("upstream redelivered %q: %q, whose packet ID the client's publish reused, is lost", got, shared)
	})
	t.Run("sessionHook", func(t *testing.T) {
		if got, _ := run(t, true); !slices.Equal(got, held) {
			t.Fatalf("after a reconnect the session got %q, want every unacknowledged message %q", got, held)
		}
	})
}

// slowFirstRoute holds the routing of the message "first" for a while,
// after mochi has sent its PUBACK (OnQosPublish runs as mochi queues the
// subscriber's copy): it widens, on demand, the window that upstream
// leaves open for any publish whose routing takes time (the store write
// of each subscriber's copy, many subscribers, a busy machine). It fixes
// nothing.
type slowFirstRoute struct{ mochi.HookBase }

func (h *slowFirstRoute) ID() string { return "slow-first-route" }

func (h *slowFirstRoute) Provides(b byte) bool { return b == mochi.OnQosPublish }

func (h *slowFirstRoute) OnQosPublish(_ *mochi.Client, pk packets.Packet, _ int64, _ int) {
	if pk.FixedHeader.Type == packets.Publish && string(pk.Payload) == "first" {
		time.Sleep(300 * time.Millisecond)
	}
}

// Defect 4: mochi sends a QoS 1 PUBACK before it routes the message, and
// each connection routes on its own goroutine: a publish sent on another
// connection after that PUBACK can reach the subscriber first.
func TestMochiDefect4AckBeforeRoute(t *testing.T) {
	run := func(t *testing.T, fixed bool) []string {
		b := newDefectBroker(t, fixed, new(slowFirstRoute))
		sub := connectPaho(t, b.url(), "sub")
		sub.subscribe(t, "cmd")
		a := connectPaho(t, b.url(), "ctl-a")
		c := connectPaho(t, b.url(), "ctl-b")
		a.publish(t, "cmd", "first") // returns on the PUBACK
		c.publish(t, "cmd", "second")
		got := payloads(sub.receive(2, 10*time.Second))
		if len(got) != 2 {
			t.Fatalf("got %q, want two messages", got)
		}
		return got
	}
	t.Run("upstream", func(t *testing.T) {
		if got := run(t, false); !slices.Equal(got, []string{"second", "first"}) {
			t.Fatalf("got %q: a publish acknowledged first was routed first: defect 4 may be fixed upstream, sessionHook's route lock may go", got)
		}
	})
	t.Run("sessionHook", func(t *testing.T) {
		if got := run(t, true); !slices.Equal(got, []string{"first", "second"}) {
			t.Fatalf("got %q, want publish order", got)
		}
	})
}

// holdDelivery holds mochi's delivery of a message on topic "cmd/late"
// to a subscriber at the point where mochi has looked the subscriber's
// connection up and not yet put the message in that connection's
// in-flight map (OnACLCheck for reading runs in between): it says so on
// held and waits for release. Like slowFirstRoute it only opens a window
// on demand. It lets everyone in.
type holdDelivery struct {
	mochi.HookBase
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func newHoldDelivery() *holdDelivery {
	return &holdDelivery{held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdDelivery) ID() string { return "hold-delivery" }

func (h *holdDelivery) Provides(b byte) bool {
	return b == mochi.OnACLCheck || b == mochi.OnConnectAuthenticate
}

func (h *holdDelivery) OnConnectAuthenticate(*mochi.Client, packets.Packet) bool { return true }

func (h *holdDelivery) OnACLCheck(_ *mochi.Client, topic string, write bool) bool {
	if !write && topic == "cmd/late" {
		h.once.Do(func() {
			close(h.held)
			<-h.release
		})
	}
	return true
}

// Defect 5, not worked around: a message that mochi is routing to a
// persistent session while the session's client reconnects can go into
// the in-flight map of the connection being replaced, after the new
// connection has inherited that map. The new connection does not get it;
// the store has it, so it comes back after a broker restart (with
// sessionHook; upstream, defect 1 loses it there too). A controller
// resends until it sees a Result, so the command is late, not lost.
func TestMochiDefect5RoutedDuringTakeover(t *testing.T) {
	run := func(t *testing.T, fixed bool) (beforeRestart, afterRestart []string) {
		hold := newHoldDelivery()
		b := newDefectBroker(t, fixed, hold)
		var released sync.Once
		release := func() { released.Do(func() { close(hold.release) }) }
		t.Cleanup(release) // before the broker stops: a held delivery would block its Close
		sub := connectPaho(t, b.url(), "sub")
		sub.subscribe(t, "cmd/#")
		sub.Disconnect(0)
		pub := connectPaho(t, b.url(), "pub")
		pub.publish(t, "cmd/late", "late") // returns on the PUBACK
		select {
		case <-hold.held: // mochi has picked the old connection
		case <-time.After(10 * time.Second):
			t.Fatal("the delivery never reached OnACLCheck")
		}
		sub = connectPaho(t, b.url(), "sub") // takes the session over
		release()
		beforeRestart = payloads(sub.receive(1, quiet))
		sub.Disconnect(0)
		b.restart()
		sub = connectPaho(t, b.url(), "sub")
		afterRestart = payloads(sub.receive(1, quiet))
		return beforeRestart, afterRestart
	}
	t.Run("upstream", func(t *testing.T) {
		before, after := run(t, false)
		if len(before) != 0 || len(after) != 0 {
			t.Fatalf("the session got %q, after a restart %q: defect 5 (or 1) is fixed upstream, update docs/mochi.md", before, after)
		}
	})
	t.Run("sessionHook", func(t *testing.T) {
		before, after := run(t, true)
		if len(before) != 0 {
			t.Fatalf("the reconnected session got %q: sessionHook now handles defect 5, update docs/mochi.md and this test", before)
		}
		if !slices.Equal(after, []string{"late"}) {
			t.Fatalf("after a restart the session got %q, want the message the store kept", after)
		}
	})
}

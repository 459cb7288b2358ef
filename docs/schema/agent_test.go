package schema_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

const (
	gw      = "gw-schema"
	replies = "ctl/replies/schema"
)

// captured holds every message seen on the gateway's topics and on the
// reply topic, in arrival order.
type captured struct {
	mu   sync.Mutex
	msgs []mqtttest.Received
}

func (c *captured) drain(ch <-chan mqtttest.Received, done <-chan struct{}) {
	for {
		select {
		case m := <-ch:
			c.mu.Lock()
			c.msgs = append(c.msgs, m)
			c.mu.Unlock()
		case <-done:
			return
		}
	}
}

func (c *captured) all() []mqtttest.Received {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.msgs)
}

// results are the captured Results (on result topics and the reply topic),
// decoded.
func (c *captured) results() []wire.Result {
	var out []wire.Result
	for _, m := range c.all() {
		if isResultTopic(m.Topic) {
			var r wire.Result
			if json.Unmarshal(m.Payload, &r) == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

func isResultTopic(topic string) bool {
	return strings.HasSuffix(topic, "/result") || strings.HasPrefix(topic, replies)
}

// waitFor polls until cond holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lockedBuffer collects the agent's log, shown when the test fails.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func closedPortURL(t *testing.T) string { return "http://" + testkit.FreeAddr(t) }

// buildRangeLimit builds the range-limit example plugin into dir.
func buildRangeLimit(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-buildmode=c-shared",
		"-o", filepath.Join(dir, "range-limit.wasm"), "../../plugins/range-limit")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building range-limit: %v\n%s", err, out)
	}
}

// The agent's real messages validate against the schemas. One agent, on a
// real mosquitto, in front of firmware-sim, is sent commands that end in
// every code the agent produces on a gateway without signed commands
// (unauthorized: TestUnauthorizedResultsValidate), a replay of a recorded outcome, an
// unknown outcome and its resolution, Results to reply_to; every Result,
// DeviceState and status message it publishes is captured from the broker
// and validated, and so is every command sent (those the agent answered
// invalid must fail the Command schema, the others pass). The retained
// flags are checked with a fresh subscriber.
func TestAgentMessagesValidate(t *testing.T) {
	s := schemas(t)
	broker := mqtttest.StartMosquitto(t)
	fw := sim.StartForTest(t, map[string]string{
		"pump-1": "pump", "pump-lock": "pump", "slow": "generic", "drop": "generic",
		"flaky": "generic", "pump-pol": "pump", "pump-perr": "pump",
		"pump-clamp": "pump", "held": "generic",
	})
	plugins := t.TempDir()
	buildRangeLimit(t, plugins)

	dir := t.TempDir()
	drv := func(extra string) string {
		return fmt.Sprintf("{url: %s, idempotent: true, queryable: true%s}", fw.URL(), extra)
	}
	limits := "limits: {timeout: 2s, init_timeout: 30s" // generous: the race detector slows the host
	cfgText := fmt.Sprintf(`gateway_id: %s
data_dir: %s
mqtt:
  broker: %s
  client_id: schema-agent
admin:
  listen: 127.0.0.1:0
plugins:
  dir: %s
devices:
  - {id: pump-1, type: pump, driver: %s}
  - {id: pump-lock, type: pump, lock: locks/device/pump-lock, driver: %s}
  - {id: slow, type: generic, queue: 1, driver: {url: %s, queryable: true, timeout: 20s}}
  - {id: drop, type: generic, driver: %s}
  - {id: flaky, type: generic, driver: %s}
  - {id: gone, type: generic, driver: {url: %s}}
  - {id: held, type: generic, driver: {url: %s, queryable: false, resolve_settle: 0s}}
  - id: pump-pol
    type: pump
    driver: %s
    policy: {plugin: range-limit, config: {param: rpm, max: 3000}, %s}}
  - id: pump-perr
    type: pump
    driver: %s
    policy: {plugin: range-limit, config: {param: rpm, max: 3000}, %s, max_input: 16}}
  - id: pump-clamp
    type: pump
    driver: %s
    policy: {plugin: range-limit, config: {param: rpm, max: 3000, clamp: true}, %s}}
`, gw, filepath.Join(dir, "data"), broker.URL(), plugins,
		drv(""), drv(""), fw.URL(), drv(""), drv(", resends: 0"), closedPortURL(t), fw.URL(),
		drv(""), limits, drv(""), limits, drv(""), limits)
	cfgPath := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		t.Fatalf("%v\n%s", err, cfgText)
	}

	// Capture before the agent starts, so its first status and states are
	// seen too.
	var got captured
	done := make(chan struct{})
	var drained sync.WaitGroup
	for _, filter := range []string{wire.DefaultPrefix + "/" + gw + "/#", replies + "/#"} {
		ch := mqtttest.Subscribe(t, broker.URL(), filter)
		drained.Add(1)
		go func() { defer drained.Done(); got.drain(ch, done) }()
	}
	t.Cleanup(func() { close(done); drained.Wait() })

	var logs lockedBuffer
	a := app.New(cfg, app.Options{Version: "schema-test", Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	}
	defer stop()
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()
	waitFor(t, 15*time.Second, "the agent to subscribe", func() bool { return a.Ready() == nil })

	pub := paho.NewClient(paho.NewClientOptions().AddBroker(broker.URL()).SetClientID("schema-ctl").
		SetCleanSession(true).SetProtocolVersion(4).SetConnectTimeout(5 * time.Second))
	if tok := pub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect: %v", tok.Error())
	}
	defer pub.Disconnect(100)

	// sent is every command payload published, with whether the agent
	// must find it invalid.
	type sentCmd struct {
		payload []byte
		invalid bool
	}
	var sent []sentCmd
	send := func(dev string, payload []byte, invalid bool) {
		t.Helper()
		sent = append(sent, sentCmd{payload, invalid})
		tok := pub.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, dev), 1, false, payload)
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish to %s: %v", dev, tok.Error())
		}
	}
	cmd := func(dev, opID string, fence int64, action, params string, mod func(*wire.Command)) {
		t.Helper()
		c := wire.Command{OpID: opID, Fence: fence, Action: action}
		if params != "" {
			c.Params = json.RawMessage(params)
		}
		if mod != nil {
			mod(&c)
		}
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		send(dev, b, false)
	}
	// await waits for a Result of opID with this code and duplicate flag.
	await := func(opID string, code wire.Code, dup bool) wire.Result {
		t.Helper()
		var found wire.Result
		waitFor(t, 60*time.Second, fmt.Sprintf("a Result %s/%s duplicate %v", opID, code, dup), func() bool {
			for _, r := range got.results() {
				if r.OpID == opID && r.Code == code && r.Duplicate == dup {
					found = r
					return true
				}
			}
			return false
		})
		return found
	}
	// awaitOn is await for a Result without op_id (an unparseable command)
	// on a device.
	awaitOn := func(dev string, code wire.Code, reason string) {
		t.Helper()
		waitFor(t, 30*time.Second, fmt.Sprintf("a Result %s for %s", code, dev), func() bool {
			for _, r := range got.results() {
				if r.Device == dev && r.OpID == "" && r.Code == code && strings.Contains(r.Reason, reason) {
					return true
				}
			}
			return false
		})
	}
	setFaults := func(f sim.Faults) {
		t.Helper()
		if err := fw.SetFaults(f); err != nil {
			t.Fatal(err)
		}
	}

	// applied, and its replay; a Result to reply_to.
	cmd("pump-1", "ok-1", 5, "set", `{"rpm":1200}`, nil)
	await("ok-1", wire.CodeOK, false)
	cmd("pump-1", "ok-1", 5, "set", `{"rpm":1200}`, nil)
	await("ok-1", wire.CodeOK, true)
	cmd("pump-1", "reply-1", 5, "set", `{"rpm":1300}`, func(c *wire.Command) { c.ReplyTo = replies + "/a"; c.Holder = "ctl-a" })
	await("reply-1", wire.CodeOK, false)
	// a barrier, then a stale fence, and its replay (recorded).
	cmd("pump-1", "barrier-1", 9, wire.ActionFence, "", nil)
	await("barrier-1", wire.CodeOK, false)
	cmd("pump-1", "stale-1", 8, "set", `{"rpm":1}`, nil)
	await("stale-1", wire.CodeStaleFence, false)
	cmd("pump-1", "stale-1", 8, "set", `{"rpm":1}`, nil)
	await("stale-1", wire.CodeStaleFence, true)
	// op_conflict: ok-1 again with other params.
	cmd("pump-1", "ok-1", 9, "set", `{"rpm":1500}`, nil)
	await("ok-1", wire.CodeOpConflict, false)
	// expired.
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	cmd("pump-1", "exp-1", 9, "set", `{"rpm":100}`, func(c *wire.Command) { c.ExpiresAt = &past })
	await("exp-1", wire.CodeExpired, false)
	// device_error: the pump's hardware refuses 99999 rpm (422).
	cmd("pump-1", "err-1", 9, "set", `{"rpm":99999}`, nil)
	await("err-1", wire.CodeDeviceError, false)
	// invalid: a fence that is not one (op_id still echoed); a payload that
	// is not JSON (nothing echoed); a bad action with a readable reply_to.
	send("pump-1", []byte(`{"op_id":"inv-1","fence":0,"action":"set"}`), true)
	await("inv-1", wire.CodeInvalid, false)
	send("pump-1", []byte(`this is not json`), true)
	awaitOn("pump-1", wire.CodeInvalid, "JSON")
	send("pump-1", []byte(`{"op_id":"inv-2","fence":3,"action":"Set","reply_to":"`+replies+`/b"}`), true)
	await("inv-2", wire.CodeInvalid, false)
	// unknown_device, for an ID that is not a device's and for a topic
	// level that is no device ID at all.
	cmd("nosuch", "nodev-1", 1, "set", `{}`, nil)
	await("nodev-1", wire.CodeUnknownDevice, false)
	cmd("no such device!", "nodev-2", 1, "set", `{}`, nil)
	await("nodev-2", wire.CodeUnknownDevice, false)
	// lock_mismatch, then the bound lock.
	cmd("pump-lock", "lock-1", 1, "set", `{"rpm":10}`, nil)
	await("lock-1", wire.CodeLockMismatch, false)
	cmd("pump-lock", "lock-2", 1, "set", `{"rpm":10}`, func(c *wire.Command) { c.Lock = "locks/device/pump-lock" })
	await("lock-2", wire.CodeOK, false)
	// policy_denied and policy_error (an input larger than max_input).
	cmd("pump-pol", "pol-1", 1, "set", `{"rpm":4000}`, nil)
	await("pol-1", wire.CodePolicyDenied, false)
	cmd("pump-perr", "perr-1", 1, "set", `{"rpm":4000}`, nil)
	await("perr-1", wire.CodePolicyError, false)
	// a policy's rewrite: clamped to 3000, applied, and the Result (and
	// its replay) says what was sent.
	cmd("pump-clamp", "clamp-1", 1, "set", `{"rpm":4000}`, nil)
	for _, dup := range []bool{false, true} {
		if r := await("clamp-1", wire.CodeOK, dup); string(r.RewrittenParams) != `{"rpm":3000}` || string(r.Output) != `{"rpm":3000}` {
			t.Errorf("clamped write (duplicate %v): rewritten_params %s, output %s; want both {\"rpm\":3000}", dup, r.RewrittenParams, r.Output)
		}
		if !dup {
			cmd("pump-clamp", "clamp-1", 1, "set", `{"rpm":4000}`, nil)
		}
	}
	// device_unreachable: nothing listens on gone's port.
	cmd("gone", "gone-1", 1, "set", `{"x":1}`, nil)
	await("gone-1", wire.CodeDeviceUnreachable, false)
	// unknown, then resolved: the firmware applies the write and drops the
	// response; the agent asks and learns it was applied.
	setFaults(sim.Faults{Device: "drop", DropResponseRate: 1})
	cmd("drop", "drop-1", 1, "set", `{"x":1}`, nil)
	await("drop-1", wire.CodeOutcomeUnknown, false)
	setFaults(sim.Faults{})
	await("drop-1", wire.CodeOK, false)
	// held for an operator: held's firmware applies the write and drops
	// the response, held cannot be asked; its DeviceState counts the
	// held write (held_writes 1) until the operator's resolve ends it.
	setFaults(sim.Faults{Device: "held", DropResponseRate: 1})
	cmd("held", "held-1", 1, "set", `{"x":1}`, nil)
	await("held-1", wire.CodeOutcomeUnknown, false)
	setFaults(sim.Faults{})
	heldStates := func() []int {
		var n []int
		for _, m := range got.all() {
			var ds wire.DeviceState
			if m.Topic == wire.StateTopic(wire.DefaultPrefix, gw, "held") && json.Unmarshal(m.Payload, &ds) == nil {
				n = append(n, ds.HeldWrites)
			}
		}
		return n
	}
	waitFor(t, 10*time.Second, "held's state with held_writes 1", func() bool { return slices.Contains(heldStates(), 1) })
	resp, err := http.Post("http://"+a.AdminAddr()+"/v1/devices/held/ops/held-1/resolve", "application/json", strings.NewReader(`{"applied":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("resolve held-1: %s", resp.Status)
	}
	await("held-1", wire.CodeOK, false)
	waitFor(t, 10*time.Second, "held's state without held writes after the resolve", func() bool {
		n := heldStates()
		return n[len(n)-1] == 0
	})
	// not_applied: every apply is a 503 (not applied), the agent's query
	// tombstones the key, and with driver.resends 0 it is not sent again.
	setFaults(sim.Faults{Device: "flaky", ErrorRate: 1})
	cmd("flaky", "flaky-1", 1, "set", `{"x":1}`, nil)
	await("flaky-1", wire.CodeOutcomeUnknown, false)
	await("flaky-1", wire.CodeNotApplied, false)
	setFaults(sim.Faults{})
	// busy: slow's firmware holds the first write; one more waits (queue:
	// 1); the next is refused. Released, the held write's connection is
	// closed unapplied: unknown; the agent's query tombstones the key, it
	// sends the write again under a new key, and both end ok. (slow is not
	// idempotent: the agent then uses a fresh connection per try, which
	// Go's HTTP client never re-sends on its own.)
	setFaults(sim.Faults{Device: "slow", Hang: true})
	cmd("slow", "slow-1", 1, "set", `{"x":1}`, nil)
	waitFor(t, 20*time.Second, "slow-1 to be held by the firmware", func() bool { return fw.Injected().Held >= 1 })
	cmd("slow", "slow-2", 1, "set", `{"x":2}`, nil)
	cmd("slow", "slow-3", 1, "set", `{"x":3}`, nil)
	await("slow-3", wire.CodeBusy, false)
	setFaults(sim.Faults{})
	await("slow-1", wire.CodeOutcomeUnknown, false)
	await("slow-1", wire.CodeOK, false)
	await("slow-2", wire.CodeOK, false)

	// Every code the agent produces today was seen.
	seen := map[wire.Code]bool{}
	for _, r := range got.results() {
		seen[r.Code] = true
	}
	for _, c := range wire.Codes {
		if c == wire.CodeUnauthorized || c == wire.CodeFenceUnconfirmed {
			if seen[c] {
				t.Errorf("a %s Result from a gateway that neither requires signed commands nor coordinates", c)
			}
			continue // TestUnauthorizedResultsValidate, TestFenceUnconfirmedResultValidates
		}
		if !seen[c] {
			t.Errorf("no Result with code %s was produced", c)
		}
	}

	// The retained flags, as a new subscriber sees them: states and status
	// are retained, Results are not.
	fresh := mqtttest.Subscribe(t, broker.URL(), wire.StateFilter(wire.DefaultPrefix, gw))
	st := mqtttest.Await(t, fresh, 10*time.Second, func(m mqtttest.Received) bool {
		return m.Topic == wire.StateTopic(wire.DefaultPrefix, gw, "pump-1")
	})
	if !st.Retained {
		t.Errorf("pump-1's DeviceState reached a new subscriber without RETAIN")
	}
	if err := check(s["deviceState"], st.Payload); err != nil {
		t.Errorf("retained DeviceState %s: %v", st.Payload, err)
	}
	freshStatus := mqtttest.Subscribe(t, broker.URL(), wire.StatusTopic(wire.DefaultPrefix, gw))
	if m := mqtttest.Await(t, freshStatus, 10*time.Second, nil); !m.Retained {
		t.Errorf("the status %s reached a new subscriber without RETAIN", m.Payload)
	}
	freshResults := mqtttest.Subscribe(t, broker.URL(), wire.ResultFilter(wire.DefaultPrefix, gw))
	marker := []byte(`{"marker":true}`)
	mqtttest.Publish(t, broker.URL(), wire.ResultTopic(wire.DefaultPrefix, gw, "zz-marker"), marker, false)
	if m := mqtttest.Await(t, freshResults, 10*time.Second, nil); string(m.Payload) != string(marker) {
		t.Errorf("a new subscriber to the result topics got %s (retained %v) before the marker: a Result was retained", m.Payload, m.Retained)
	}

	// A clean stop publishes the status offline.
	stop()
	waitFor(t, 20*time.Second, "the status offline", func() bool {
		for _, m := range got.all() {
			if m.Topic == wire.StatusTopic(wire.DefaultPrefix, gw) && strings.Contains(string(m.Payload), `"offline"`) {
				return true
			}
		}
		return false
	})

	// Validate everything captured.
	counts := map[string]int{}
	for _, m := range got.all() {
		var kind string
		switch {
		case len(m.Payload) == 0:
			continue // a cleared retained message
		case m.Topic == wire.ResultTopic(wire.DefaultPrefix, gw, "zz-marker"):
			continue // the retained-flag check's own marker
		case isResultTopic(m.Topic):
			kind = "result"
		case strings.HasSuffix(m.Topic, "/state"):
			kind = "deviceState"
		case m.Topic == wire.StatusTopic(wire.DefaultPrefix, gw):
			kind = "status"
		case strings.HasSuffix(m.Topic, "/cmd"):
			continue // our own commands, checked below
		default:
			t.Errorf("a message on an unexpected topic %s: %s", m.Topic, m.Payload)
			continue
		}
		counts[kind]++
		if err := check(s[kind], m.Payload); err != nil {
			t.Errorf("%s on %s does not validate: %s\n%v", kind, m.Topic, m.Payload, err)
		}
	}
	t.Logf("validated %v", counts)
	// 27 Results were awaited above; a state for each of the 6 devices
	// written; online and offline.
	if counts["result"] < 27 || counts["deviceState"] < 6 || counts["status"] < 2 {
		t.Errorf("too few messages captured: %v", counts)
	}
	// The status names the role and host (extensions).
	var role, host string
	for _, m := range got.all() {
		var st wire.GatewayStatus
		if m.Topic == wire.StatusTopic(wire.DefaultPrefix, gw) && json.Unmarshal(m.Payload, &st) == nil {
			role, host = st.Role, st.Host
		}
	}
	if role != "single" || host == "" {
		t.Errorf("the status's role %q, host %q: want single and the host name", role, host)
	}
	for _, c := range sent {
		err := check(s["command"], c.payload)
		if c.invalid && err == nil {
			t.Errorf("the agent answered %s invalid, but it validates against the Command schema", c.payload)
		}
		if !c.invalid && err != nil {
			t.Errorf("command %s does not validate: %v", c.payload, err)
		}
	}
}

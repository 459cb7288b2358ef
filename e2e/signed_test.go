package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// Signed commands (docs/protocol.md §6): a publisher that may publish on
// a cmd topic but holds no key allowed for the device can neither poison
// last_fence nor claim an op_id; nothing it sends is written to the store.

// ctlKey is a controller's key pair, its public key written to a file.
type ctlKey struct {
	id      string
	priv    ed25519.PrivateKey
	pubFile string
	pubPEM  []byte
}

func newCtlKey(t testing.TB, id string) ctlKey {
	t.Helper()
	privPEM, pubPEM, err := jws.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	priv, _ := jws.ParsePrivateKey(privPEM)
	f := filepath.Join(t.TempDir(), id+".pub")
	if err := os.WriteFile(f, pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	return ctlKey{id: id, priv: priv, pubFile: f, pubPEM: pubPEM}
}

// securityYAML is a security section with each key allowed for globs.
func securityYAML(extra string, keys map[*ctlKey][]string) string {
	var b strings.Builder
	b.WriteString("security:\n  keys:\n")
	for k, globs := range keys {
		g, _ := json.Marshal(globs)
		fmt.Fprintf(&b, "    - {id: %s, public_key_file: %q, devices: %s}\n", k.id, k.pubFile, g)
	}
	b.WriteString(extra)
	return b.String()
}

// signCmd signs c for dev on this test gateway, valid for a minute.
func signCmd(t testing.TB, k ctlKey, kid, dev string, c wire.Command) []byte {
	t.Helper()
	if c.Gateway == "" {
		c.Gateway = gw
	}
	if c.Device == "" {
		c.Device = dev
	}
	if c.ExpiresAt == nil {
		exp := time.Now().Add(time.Minute).UTC()
		c.ExpiresAt = &exp
	}
	p, _ := json.Marshal(c)
	b, err := jws.Sign(k.priv, kid, p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) adminLastFence(dev string) int64 {
	e.t.Helper()
	code, body := e.admin("/v1/devices/" + dev)
	var di wire.DeviceInfo
	if code != 200 || json.Unmarshal(body, &di) != nil {
		e.t.Fatalf("admin device %s: %d %s", dev, code, body)
	}
	return di.LastFence
}

// opRecords counts the store's op records (of every device).
func (e *env) opRecords() int {
	e.t.Helper()
	n := 0
	if err := e.app.Store().View(func(tx *store.Tx) error {
		return tx.Ops("", func(store.Op) error { n++; return nil })
	}); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// The attack: fence 2^63-1, unsigned, on a device that requires
// signatures. Without §6 it is applied as a barrier and every real owner
// gets stale_fence for good.
func TestForgedFenceIsUnauthorized(t *testing.T) {
	owner := newCtlKey(t, "ctl-a")
	e := newEnv(t, pump("pump-7"))
	e.extra = securityYAML("", map[*ctlKey][]string{&owner: {"pump-*"}})
	e.start()
	reply := mqtttest.Subscribe(t, e.broker, "rogue/inbox")

	e.send("pump-7", signCmd(t, owner, "ctl-a", "pump-7", cmd("own-1", 10, "set", `{"rpm":100}`)))
	want(t, e.result("own-1", 1), wire.StatusApplied, wire.CodeOK)
	records := e.opRecords()

	forged := cmd("rogue-1", 9223372036854775807, wire.ActionFence, "")
	forged.ReplyTo = "rogue/inbox"
	e.send("pump-7", forged)
	r := e.result("rogue-1", 1)
	want(t, r, wire.StatusRejected, wire.CodeUnauthorized)
	if r.LastFence != 10 || r.Fence != 9223372036854775807 || !strings.Contains(r.Reason, "requires signed commands") {
		t.Fatalf("unauthorized Result: %+v", r)
	}
	if lf := e.adminLastFence("pump-7"); lf != 10 {
		t.Fatalf("last_fence %d after the forged barrier, want 10", lf)
	}
	if n := e.opRecords(); n != records {
		t.Fatalf("the forged command left a record: %d op records, want %d", n, records)
	}
	if code, _ := e.admin("/v1/devices/pump-7/ops/rogue-1"); code != 404 {
		t.Fatalf("op rogue-1 is recorded (%d)", code)
	}

	// The real owner carries on under its fence.
	e.send("pump-7", signCmd(t, owner, "ctl-a", "pump-7", cmd("own-2", 10, "set", `{"rpm":200}`)))
	r = e.result("own-2", 1)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if r.LastFence != 10 {
		t.Fatalf("owner's Result: %+v", r)
	}
	if got := strings.Join(e.journalOps(), ","); got != "own-1,own-2" {
		t.Fatalf("journal %q, want own-1,own-2", got)
	}
	// The unauthorized answer went to the result topic only, never to the
	// forged reply_to (everything the agent published since came later).
	select {
	case m := <-reply:
		t.Fatalf("a Result went to the forged reply_to: %s", m.Payload)
	default:
	}
}

// An unsigned command that pre-claims the op_id the owner is about to use
// does not block it: it claimed nothing.
func TestPreclaimedOpIDDoesNotBlockTheOwner(t *testing.T) {
	owner := newCtlKey(t, "ctl-a")
	e := newEnv(t, pump("pump-7"))
	e.extra = securityYAML("", map[*ctlKey][]string{&owner: {"*"}})
	e.start()

	e.send("pump-7", cmd("op-x", 5, "set", `{"rpm":6000}`))
	want(t, e.result("op-x", 1), wire.StatusRejected, wire.CodeUnauthorized)
	e.send("pump-7", signCmd(t, owner, "ctl-a", "pump-7", cmd("op-x", 5, "set", `{"rpm":100}`)))
	r := e.result("op-x", 2)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if r.Duplicate || string(r.Output) != `{"rpm":100}` {
		t.Fatalf("the owner's op-x: %+v", r)
	}
	if j := e.journal(); len(j) != 1 || string(j[0].Params) != `{"rpm":100}` {
		t.Fatalf("journal %+v", j)
	}
}

// Every forgery of the list is unauthorized, leaves no record,
// raises no fence and reaches no device.
func TestForgeriesAreUnauthorized(t *testing.T) {
	owner, valves, rogue := newCtlKey(t, "ctl-a"), newCtlKey(t, "ctl-v"), newCtlKey(t, "ctl-r")
	e := newEnv(t, pump("pump-7"), pump("pump-8"))
	e.extra = securityYAML("  max_ttl: 5m\n", map[*ctlKey][]string{&owner: {"pump-*"}, &valves: {"valve-*"}})
	e.start()
	e.send("pump-7", signCmd(t, owner, "ctl-a", "pump-7", cmd("setup-7", 3, "set", `{"rpm":1}`)))
	e.send("pump-8", signCmd(t, owner, "ctl-a", "pump-8", cmd("setup-8", 3, "set", `{"rpm":1}`)))
	want(t, e.result("setup-7", 1), wire.StatusApplied, wire.CodeOK)
	want(t, e.result("setup-8", 1), wire.StatusApplied, wire.CodeOK)
	records := e.opRecords()

	big := func(op string) wire.Command { return cmd(op, 9223372036854775807, wire.ActionFence, "") }
	good := signCmd(t, owner, "ctl-a", "pump-7", big("tampered"))
	parts := strings.Split(string(good), ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(payload), `"fence":9223372036854775807`, `"fence":9223372036854775806`, 1)))
	tampered := strings.Join(parts, ".")
	// HS256 with the controller's public key as the HMAC secret: the
	// classic confusion of a verifier that takes alg from the header.
	hsInput := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","kid":"ctl-a"}`)) + "." + base64.RawURLEncoding.EncodeToString(mustJSON(t, withBinding(big("hs256"), "pump-7", time.Minute)))
	mac := hmac.New(sha256.New, owner.pubPEM)
	mac.Write([]byte(hsInput))
	hs256 := hsInput + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	none := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","kid":"ctl-a"}`)) + "." + base64.RawURLEncoding.EncodeToString(mustJSON(t, withBinding(big("none"), "pump-7", time.Minute))) + "."
	other := big("other-gw")
	other.Gateway = "gw-2"
	late := withBinding(big("late"), "pump-8", 10*time.Minute)

	for _, tt := range []struct {
		name, op, dev string
		msg           []byte
		reason        string
	}{
		{"tampered payload", "tampered", "pump-7", []byte(tampered), `does not verify with key "ctl-a"`},
		{"wrong kid", "wrong-kid", "pump-7", signCmd(t, owner, "ctl-v", "pump-7", big("wrong-kid")), `key "ctl-v" may not command device pump-7`},
		{"a rogue key under the owner's kid", "rogue-key", "pump-7", signCmd(t, rogue, "ctl-a", "pump-7", big("rogue-key")), "does not verify"},
		{"an unknown kid", "unknown-kid", "pump-7", signCmd(t, rogue, "ctl-r", "pump-7", big("unknown-kid")), `key "ctl-r" is not configured`},
		{"a key not allowed for the device", "valve-key", "pump-8", signCmd(t, valves, "ctl-v", "pump-8", big("valve-key")), `may not command device pump-8`},
		{"alg none", "none", "pump-8", []byte(none), "not a valid signed command"},
		{"alg HS256 with the public key as secret", "hs256", "pump-8", []byte(hs256), "algorithm not accepted"},
		{"a payload for another gateway", "other-gw", "pump-7", signCmd(t, owner, "ctl-a", "pump-7", other), `signed for gateway "gw-2"`},
		{"a payload for another device", "other-dev", "pump-8", signCmd(t, owner, "ctl-a", "pump-7", big("other-dev")), `signed for device "pump-7", not pump-8`},
		{"expires_at beyond max_ttl", "late", "pump-8", signCmd(t, owner, "ctl-a", "pump-8", late), "more than max_ttl (5m0s)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e.send(tt.dev, tt.msg)
			r := e.result(tt.op, 1)
			want(t, r, wire.StatusRejected, wire.CodeUnauthorized)
			if !strings.Contains(r.Reason, tt.reason) || r.LastFence != 3 {
				t.Fatalf("Result %+v, want a reason with %q and last_fence 3", r, tt.reason)
			}
		})
	}
	if lf7, lf8 := e.adminLastFence("pump-7"), e.adminLastFence("pump-8"); lf7 != 3 || lf8 != 3 {
		t.Fatalf("last_fence %d/%d, want 3/3", lf7, lf8)
	}
	if n := e.opRecords(); n != records {
		t.Fatalf("%d op records, want %d: a forgery was recorded", n, records)
	}
	if got := strings.Join(e.journalOps(), ","); got != "setup-7,setup-8" && got != "setup-8,setup-7" {
		t.Fatalf("journal %q", got)
	}
}

func withBinding(c wire.Command, dev string, ttl time.Duration) wire.Command {
	c.Gateway, c.Device = gw, dev
	exp := time.Now().Add(ttl).UTC()
	c.ExpiresAt = &exp
	return c
}

func mustJSON(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A replay of a signed command before its expiry meets its record
// (duplicate: true); once the record is gone (retention is at least
// max_ttl), the replay meets its expiry. Nothing runs twice.
func TestSignedReplay(t *testing.T) {
	owner := newCtlKey(t, "ctl-a")
	e := newEnv(t, pump("pump-7"))
	e.extra = "dedup: {retention: 2s, keep_last: 0}\n" + securityYAML("  max_ttl: 2s\n", map[*ctlKey][]string{&owner: {"*"}})
	a := e.start()

	c := withBinding(cmd("op-r", 4, "set", `{"rpm":300}`), "pump-7", 1500*time.Millisecond)
	msg := signCmd(t, owner, "ctl-a", "pump-7", c)
	e.send("pump-7", msg)
	first := e.result("op-r", 1)
	want(t, first, wire.StatusApplied, wire.CodeOK)

	e.send("pump-7", msg)
	r := e.result("op-r", 2)
	want(t, r, wire.StatusApplied, wire.CodeOK)
	if !r.Duplicate || !r.At.Equal(first.At) {
		t.Fatalf("replay within its TTL: %+v", r)
	}

	// After expires_at, while the record is kept: still its record.
	testkit.Eventually(t, 10*time.Second, "expires_at passed", func() bool { return time.Now().After(*c.ExpiresAt) })
	e.send("pump-7", msg)
	if r := e.result("op-r", 3); !r.Duplicate || r.Code != wire.CodeOK {
		t.Fatalf("replay after expiry, record kept: %+v", r)
	}

	// Retention (2s, keep_last 0) deletes the record; the replay now
	// meets its expiry in the worker.
	var swept int
	testkit.Eventually(t, 10*time.Second, "the record swept", func() bool {
		a.Store().Update(context.Background(), func(tx *store.Tx) error {
			n, err := tx.Sweep(time.Now(), 2*time.Second, 0, 1000)
			swept += n
			return err
		})
		return swept > 0
	})
	e.send("pump-7", msg)
	r = e.result("op-r", 4)
	want(t, r, wire.StatusRejected, wire.CodeExpired)
	if r.Duplicate {
		t.Fatalf("replay after the record left: %+v", r)
	}
	if n := len(e.journal()); n != 1 {
		t.Fatalf("journal has %d entries: a replay ran again", n)
	}
}

// 20,000 forged commands in a burst: the store file does not grow, no op
// record is written, the unauthorized Results are rate limited (10/s per
// device, the rest counted), and a signed command sent in the middle of
// the burst is applied.
func TestForgedFloodCostsNoDisk(t *testing.T) {
	const n = 20000
	owner := newCtlKey(t, "ctl-a")
	p := pump("pump-7")
	p.queue = 1000
	e := newEnv(t, p)
	e.extra = securityYAML("", map[*ctlKey][]string{&owner: {"*"}})
	e.start()
	// Let the file reach its working size first: bbolt writes copy on
	// write and grows the file in steps, so a file with few pages grows
	// for one command more.
	for i := range 300 {
		e.send("pump-7", signCmd(t, owner, "ctl-a", "pump-7", cmd(fmt.Sprintf("warm-%d", i), 7, "set", fmt.Sprintf(`{"rpm":%d}`, i))))
	}
	want(t, e.final("warm-299"), wire.StatusApplied, wire.CodeOK)
	db := filepath.Join(e.dataDir, "agent.db")
	before, err := os.Stat(db)
	if err != nil {
		t.Fatal(err)
	}
	records := e.opRecords()

	rogue := newCtlKeyNoFile(t)
	start := time.Now()
	forge := func(i int) paho.Token {
		dev := "pump-7"
		if i%4 == 3 {
			dev = fmt.Sprintf("ghost-%d", i) // devices nobody configured share one budget
		}
		b := mustJSON(t, cmd(fmt.Sprintf("forged-%d", i), 9223372036854775807, wire.ActionFence, ""))
		if i%2 == 1 { // and signed by nobody the agent knows
			b = signCmd(t, rogue, "ctl-a", dev, cmd(fmt.Sprintf("forged-%d", i), 9223372036854775807, wire.ActionFence, ""))
		}
		return e.sender.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, dev), 1, false, b)
	}
	wait := func(toks []paho.Token) {
		t.Helper()
		for i, tok := range toks {
			if !tok.WaitTimeout(60*time.Second) || tok.Error() != nil {
				t.Fatalf("publish #%d: %v", i, tok.Error())
			}
		}
	}
	counted := func(want float64) (answered, dropped float64) {
		t.Helper()
		testkit.Eventually(t, 60*time.Second, "every forged command counted", func() bool {
			answered, dropped = e.metric(`edge_agent_commands_total{code="unauthorized"}`), e.metric("edge_agent_unauthorized_dropped_total")
			return answered+dropped == want
		})
		return answered, dropped
	}
	// The first half of the flood, alone: nothing is written at all (no
	// commit, the file the same size). The warm-up's last outbox deletions
	// ride along with a commit of their own first (store.Later).
	testkit.Eventually(t, 10*time.Second, "the warm-up's Results published and their outbox entries deleted", func() bool {
		empty := true
		e.app.Store().View(func(tx *store.Tx) error {
			return tx.Outbox(func(store.Outbox) error { empty = false; return nil })
		})
		return empty && e.app.Store().Quiet()
	})
	commits := e.app.Store().Stats().Commits
	toks := make([]paho.Token, 0, n+1)
	for i := range n / 2 {
		toks = append(toks, forge(i))
	}
	wait(toks)
	counted(n / 2)
	if c := e.app.Store().Stats().Commits; c != commits {
		t.Fatalf("%d commits during a forged flood, want none", c-commits)
	}
	if after, _ := os.Stat(db); after.Size() != before.Size() {
		t.Fatalf("agent.db grew from %d to %d bytes under a forged flood", before.Size(), after.Size())
	}
	// A signed command in the middle of the rest of it is applied.
	toks = toks[:0]
	for i := n / 2; i < n; i++ {
		toks = append(toks, forge(i))
		if i == n/2+n/4 {
			toks = append(toks, e.sender.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, "pump-7"), 1, false,
				signCmd(t, owner, "ctl-a", "pump-7", cmd("own-mid", 7, "set", `{"rpm":4000}`))))
		}
	}
	wait(toks)
	want(t, e.result("own-mid", 1), wire.StatusApplied, wire.CodeOK)
	answered, dropped := counted(n)
	elapsed := time.Since(start)
	// Two budgets (pump-7, and every unconfigured device together) of 10
	// per second, each starting with a burst of 10.
	if limit := 2 * (10 + 10*elapsed.Seconds() + 10); answered > limit || dropped == 0 {
		t.Fatalf("%v unauthorized Results in %s (limit %.0f), %v dropped", answered, elapsed, limit, dropped)
	}
	after, _ := os.Stat(db)
	if got := e.opRecords(); got != records+1 {
		t.Fatalf("%d op records, want %d (the warm-up and own-mid)", got, records+1)
	}
	if lf := e.adminLastFence("pump-7"); lf != 7 {
		t.Fatalf("last_fence %d", lf)
	}
	t.Logf("%d forged commands in %s: %v answered, %v dropped; agent.db %d bytes before and after", n, elapsed, answered, dropped, after.Size())
}

// newCtlKeyNoFile is a key pair nobody configured.
func newCtlKeyNoFile(t testing.TB) ctlKey {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return ctlKey{id: "nobody", priv: priv}
}

// metric reads one sample of the agent's /metrics.
func (e *env) metric(series string) float64 {
	e.t.Helper()
	_, body := e.admin("/metrics")
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return 0
}

// Key rotation by SIGHUP, on the agent process: commands admitted under
// the old key (queued behind a slow device) all end applied; from the
// reload on, the new key is accepted and the old refused; a bad key file
// on a later SIGHUP keeps the keys in use.
func TestKeyRotationBySIGHUP(t *testing.T) {
	oldKey := newCtlKey(t, "ctl-a")
	d := pump("pump-7")
	d.timeout = "5s"
	e := newEnv(t, d)
	e.extra = securityYAML("", map[*ctlKey][]string{&oldKey: {"*"}})
	e.adminAt = testkit.FreeAddr(t) // the process's admin API, to see what it admitted
	e.startProc()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", LatencyMS: 300})

	const inFlight = 5
	for i := range inFlight {
		e.send("pump-7", signCmd(t, oldKey, "ctl-a", "pump-7", cmd(fmt.Sprintf("old-%d", i), 8, "set", fmt.Sprintf(`{"rpm":%d}`, i))))
	}
	testkit.Eventually(t, 10*time.Second, "the first write under way", func() bool { return e.sim.Injected().Delayed > 0 })
	// Every one of them admitted (verified with the old key, recorded)
	// before the rotation: one still on its way to the agent would be
	// verified with the new key, rightly refused (failed once in CI).
	testkit.Eventually(t, 10*time.Second, "the old key's commands admitted", func() bool {
		for i := range inFlight {
			if code, _ := e.admin(fmt.Sprintf("/v1/devices/pump-7/ops/old-%d", i)); code != http.StatusOK {
				return false
			}
		}
		return true
	})

	// Rotate: the same file now holds the new key.
	newKey := newCtlKey(t, "ctl-a")
	if err := os.WriteFile(oldKey.pubFile, newKey.pubPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The reload is done once a command signed with the new key is
	// accepted (it queues behind the old ones).
	var accepted string
	for try := 0; accepted == ""; try++ {
		if try == 100 {
			t.Fatal("the new key was not accepted after SIGHUP")
		}
		op := fmt.Sprintf("new-1.%d", try)
		e.send("pump-7", signCmd(t, newKey, "ctl-a", "pump-7", cmd(op, 8, "set", `{"rpm":100}`)))
		if r := e.result(op, 1); r.Code != wire.CodeUnauthorized {
			accepted = op
		}
	}
	e.send("pump-7", signCmd(t, oldKey, "ctl-a", "pump-7", cmd("old-late", 8, "set", `{"rpm":7}`)))
	want(t, e.result("old-late", 1), wire.StatusRejected, wire.CodeUnauthorized)
	for i := range inFlight {
		want(t, e.final(fmt.Sprintf("old-%d", i)), wire.StatusApplied, wire.CodeOK)
	}
	want(t, e.final(accepted), wire.StatusApplied, wire.CodeOK)

	// A broken key file: the keys in use stay (and the process with them).
	if err := os.WriteFile(oldKey.pubFile, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.proc.Signal(syscall.SIGHUP)
	testkit.Eventually(t, 10*time.Second, "the refused reload logged", func() bool {
		return strings.Contains(e.log(), "security.keys[0] (ctl-a).public_key_file") && strings.Contains(e.log(), "the keys in use are kept")
	})
	e.send("pump-7", signCmd(t, newKey, "ctl-a", "pump-7", cmd("new-2", 8, "set", `{"rpm":101}`)))
	want(t, e.final("new-2"), wire.StatusApplied, wire.CodeOK)
	if n := len(e.journal()); n != inFlight+2 {
		t.Fatalf("journal has %d entries, want %d", n, inFlight+2)
	}
}

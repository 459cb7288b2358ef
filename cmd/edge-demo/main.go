// Command edge-demo tells the story edge-agent exists for, in under a
// minute, on the embedded defaults: an embedded MQTT broker, a simulated
// pump, the agent, two controllers that sign their commands, one of which
// pauses and wakes up stale, a rogue publisher whose forged barrier is
// refused, and a write whose answer is lost: unknown, until the agent asks
// the pump. `make demo` runs it.
package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
)

// out is where the story is told (a test reads it).
var out io.Writer = os.Stdout

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func say(format string, a ...any) {
	fmt.Fprintf(out, format+"\n", a...)
	time.Sleep(150 * time.Millisecond) // pacing for a human reader, not synchronisation
}

func run() error {
	dir := ".demo"
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	// The firmware: a simulated pump, valve and relay, journaling every write.
	fw, err := sim.New(sim.Options{Devices: map[string]string{"pump-7": "pump", "valve-1": "valve", "relay-1": "relay"},
		JournalPath: filepath.Join(dir, "journal.jsonl")})
	if err != nil {
		return err
	}
	if err := fw.Open(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := fw.Start(ctx, "127.0.0.1:0"); err != nil {
		return err
	}
	defer fw.Close()

	// The agent, on the shipped defaults (configs/agent.yaml), with its
	// data, broker port and device URLs moved so the demo runs anywhere.
	cfg, err := config.Parse(configs.AgentYAML)
	if err != nil {
		return err
	}
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.MQTT.EmbeddedListen = "127.0.0.1:0"
	cfg.Admin.Listen = "127.0.0.1:0"
	for _, d := range cfg.Devices {
		d.Driver.Config.(*device.HTTPConfig).URL = fw.URL()
	}
	if err := bindDemoPolicies(cfg); err != nil {
		return err
	}
	// Signed commands (docs/protocol.md §6): each controller has a key
	// pair; the agent knows their public keys and requires signatures.
	keys := map[string]ed25519.PrivateKey{}
	for _, name := range []string{"controller-A", "controller-B"} {
		_, priv, err := ed25519.GenerateKey(nil)
		if err != nil {
			return err
		}
		keys[name] = priv
		cfg.Security.Keys = append(cfg.Security.Keys, &config.Key{ID: name, Devices: []string{"*"},
			Public: []ed25519.PublicKey{priv.Public().(ed25519.PublicKey)}})
	}
	required := true
	cfg.Security.RequireSigned = &required
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	agent := app.New(cfg, app.Options{Logger: log, Version: "demo"})
	if err := agent.Start(ctx); err != nil {
		return err
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		agent.Stop(sctx)
		c()
	}()
	for agent.Ready() != nil {
		time.Sleep(20 * time.Millisecond)
	}
	broker := agent.BrokerURL()
	fmt.Fprintf(out, "edge-agent is running: embedded MQTT broker on %s, firmware simulator on %s\n\n", broker, fw.URL())

	a, err := newController("controller-A", broker, keys["controller-A"])
	if err != nil {
		return err
	}
	defer a.close()
	b, err := newController("controller-B", broker, keys["controller-B"])
	if err != nil {
		return err
	}
	defer b.close()

	say("(The lock service is played by this script; `edgectl send --lock` takes real locks in etcd.")
	say(" Each controller signs its commands with its own key; the agent knows their public keys.)\n")
	say("1. Controller A takes the lock on pump-7. Its fencing token is 41.")
	r := a.send("pump-7", "a-1", 41, "set", `{"rpm":1200}`)
	say("   A: set rpm=1200                -> %s", show(r))

	say("\n2. A stops the world for a long GC pause. Its lease expires while it sleeps.")
	say("   Controller B takes the lock. B's fencing token is 42.")
	r = b.send("pump-7", "b-1", 42, "set", `{"rpm":800}`)
	say("   B: set rpm=800                 -> %s", show(r))

	say("\n3. A wakes up. It still believes it owns pump-7 and sends its next command.")
	r = a.send("pump-7", "a-2", 41, "set", `{"rpm":3000}`)
	say("   A: set rpm=3000 (token 41)     -> %s", show(r))
	say("   The agent remembers the highest token it accepted (42) and refuses 41:")
	say("   the stale controller cannot overwrite the new owner's work.")

	say("\n4. A never saw the answer to its first command, so it resends it (same op_id).")
	r = a.send("pump-7", "a-1", 41, "set", `{"rpm":1200}`)
	say("   A: resend a-1                  -> %s", show(r))
	say("   The recorded outcome is replayed; nothing is written to the pump again.")
	if st, err := fw.State("pump-7"); err == nil {
		say("   (Its output is what a-1 did then; the pump itself is at %s now: B's write stands.)", compact(st))
	}

	say("\n5. B publishes garbage on pump-7's command topic (signed, but malformed).")
	r = b.sendRaw("pump-7", b.sign("pump-7", `{"op_id":"junk","fence":"lots","action":"set",`+b.binding("pump-7")+`}`), "junk")
	say("   garbage                        -> %s", show(r))
	r = b.send("pump-7", "b-2", 42, "set", `{"rpm":900}`)
	say("   The agent carries on. B: set rpm=900 -> %s", show(r))

	say("\n6. A rogue publisher, let in by the broker, tries to lock every owner out for good:")
	say("   a barrier with the highest fence there is, 9223372036854775807, and no valid signature.")
	rogue, err := newController("rogue", broker, nil)
	if err != nil {
		return err
	}
	defer rogue.close()
	r = rogue.sendRaw("pump-7", `{"op_id":"rogue-1","fence":9223372036854775807,"action":"fence"}`, "rogue-1")
	say("   rogue: fence 9223372036854775807 -> %s", show(r))
	r = b.send("pump-7", "b-5", 42, "set", `{"rpm":1000}`)
	say("   Nothing was written or raised. B carries on: set rpm=1000 -> %s", show(r))

	step := 7
	if policiesBound(cfg) {
		step++
		say("\n7. pump-7 has a policy plugin (WebAssembly): rpm must stay within 0..3000.")
		r = b.send("pump-7", "b-3", 42, "set", `{"rpm":4000}`)
		say("   B: set rpm=4000                -> %s", show(r))
		say("   valve-1's policy clamps instead of refusing: open at most 80%%.")
		r = b.send("valve-1", "b-4", 42, "set", `{"open":95}`)
		say("   B: open valve-1 95%%            -> %s", show(r))
	}

	say("\n%d. B sets the pump again, and the pump's answer is lost on the way back (the", step)
	say("   firmware applies the write, then drops the connection, on every try).")
	if err := fw.SetFaults(sim.Faults{Device: "pump-7", DropResponseRate: 1}); err != nil {
		return err
	}
	b.interim = func(r wire.Result) { say("   B: set rpm=1100 (first Result) -> %s", show(r)) }
	r = b.send("pump-7", "b-6", 42, "set", `{"rpm":1100}`)
	b.interim = nil
	if err := fw.SetFaults(sim.Faults{}); err != nil {
		return err
	}
	say("   The agent did not guess, and sent pump-7 nothing else meanwhile. It asked the pump")
	say("   about the write's idempotency key, learned it was applied, and published the final")
	say("   Result to the same place:")
	say("   B: set rpm=1100 (final Result) -> %s", show(r))

	fmt.Fprintln(out, "\nThe device journal (every write the firmware applied, oldest first):")
	for _, e := range fw.Journal() {
		fmt.Fprintf(out, "   #%d %-8s %-4s fence %d  %-12s by op %s\n", e.Seq, e.Device, e.Action, e.Fence, string(e.Params), e.OpID)
	}
	fmt.Fprintln(out, "\nOnly the writes that should have happened are there: none from the stale controller,")
	fmt.Fprintln(out, "no second copy of a-1, nothing from the rogue, nothing the policy denied, the clamped")
	fmt.Fprintln(out, "valve at 80%, and b-6 once, although its answer was lost.")
	return nil
}

func show(r wire.Result) string {
	s := fmt.Sprintf("%s/%s", r.Status, r.Code)
	if r.Duplicate {
		s += " (duplicate: the recorded outcome)"
	}
	s += fmt.Sprintf(", last_fence %d", r.LastFence)
	switch {
	case r.Status == wire.StatusApplied && len(r.Output) > 0 && r.Duplicate:
		s += ", recorded output " + string(r.Output) + " (the pump's state when it was applied, not now)"
	case r.Status == wire.StatusApplied && len(r.Output) > 0:
		s += ", device state " + string(r.Output)
	}
	if len(r.RewrittenParams) > 0 {
		s += ", sent " + string(r.RewrittenParams) + " (rewritten by the policy)"
	}
	if r.Status != wire.StatusApplied {
		s += ": " + r.Reason
	}
	return s
}

// controller is a minimal stand-in for a controller: it publishes commands
// with its own reply topic and waits for each Result.
type controller struct {
	name    string
	key     ed25519.PrivateKey // nil: sends unsigned commands
	c       paho.Client
	replyTo string
	results chan wire.Result
	// interim, when set, is shown each unknown Result of the command
	// being sent (its final one follows).
	interim func(wire.Result)
}

func newController(name, broker string, key ed25519.PrivateKey) (*controller, error) {
	k := &controller{name: name, key: key, replyTo: "demo/" + name + "/reply", results: make(chan wire.Result, 16)}
	o := paho.NewClientOptions().AddBroker(broker).SetClientID(name).SetCleanSession(true)
	k.c = paho.NewClient(o)
	if t := k.c.Connect(); !t.WaitTimeout(5*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("%s: connect: %v", name, t.Error())
	}
	t := k.c.Subscribe(k.replyTo, 1, func(_ paho.Client, m paho.Message) {
		var r wire.Result
		if json.Unmarshal(m.Payload(), &r) == nil {
			k.results <- r
		}
	})
	if !t.WaitTimeout(5*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("%s: subscribe: %v", name, t.Error())
	}
	return k, nil
}

func (k *controller) send(dev, op string, fence int64, action, params string) wire.Result {
	exp := time.Now().Add(time.Minute).UTC()
	b, _ := json.Marshal(wire.Command{OpID: op, Fence: fence, Action: action, Params: json.RawMessage(params), Holder: k.name,
		ReplyTo: k.replyTo, Gateway: "gw-1", Device: dev, ExpiresAt: &exp})
	return k.sendRaw(dev, k.sign(dev, string(b)), op)
}

// binding is the members that tie a signed command to its topic and a
// minute (docs/protocol.md §6), as JSON members.
func (k *controller) binding(dev string) string {
	return fmt.Sprintf(`"gateway":"gw-1","device":%q,"expires_at":%q`, dev, time.Now().Add(time.Minute).UTC().Format(time.RFC3339))
}

// sign makes payload a JWS by the controller's key (unchanged without one).
func (k *controller) sign(dev, payload string) string {
	if k.key == nil {
		return payload
	}
	b, err := jws.Sign(k.key, k.name, []byte(payload))
	if err != nil {
		panic(err) // the names above are valid key IDs
	}
	return string(b)
}

func (k *controller) sendRaw(dev, payload, op string) wire.Result {
	if k.key == nil || op == "junk" {
		// Malformed and unsigned commands cannot name a reply topic that
		// is read; their Result goes to the device's result topic.
		ch := make(chan wire.Result, 1)
		t := k.c.Subscribe(wire.ResultTopic(wire.DefaultPrefix, "gw-1", dev), 1, func(_ paho.Client, m paho.Message) {
			var r wire.Result
			if json.Unmarshal(m.Payload(), &r) == nil && r.OpID == op {
				select {
				case ch <- r:
				default:
				}
			}
		})
		t.Wait()
		defer k.c.Unsubscribe(wire.ResultTopic(wire.DefaultPrefix, "gw-1", dev))
		k.c.Publish(wire.CmdTopic(wire.DefaultPrefix, "gw-1", dev), 1, false, payload).Wait()
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			return wire.Result{Status: "none", Code: "timeout", Reason: "no Result within 10s"}
		}
	}
	k.c.Publish(wire.CmdTopic(wire.DefaultPrefix, "gw-1", dev), 1, false, payload).Wait()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-k.results:
			if r.OpID == op && r.Final() {
				return r
			}
			if r.OpID == op && k.interim != nil {
				k.interim(r)
			}
		case <-deadline:
			return wire.Result{Status: "none", Code: "timeout", Reason: "no Result within 10s"}
		}
	}
}

func (k *controller) close() { k.c.Disconnect(100) }

// compact is a JSON document without insignificant space.
func compact(doc []byte) string {
	var b bytes.Buffer
	if json.Compact(&b, doc) != nil {
		return string(doc)
	}
	return b.String()
}

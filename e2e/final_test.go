package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// restartSim starts the simulator again on the address of the closed one.
func (e *env) restartSim(addr string, devices map[string]string) {
	e.t.Helper()
	e.sim = sim.StartForTestWith(e.t, sim.Options{Devices: devices}, addr)
}

// Invariant 8 against a replay: a signed command that ended
// failed/device_unreachable is final. The owner, told so, moves on: the
// device comes back, and it sends rpm 0, applied. Anyone who captured the
// first command's bytes on the cmd topic republishes them within their
// TTL: they meet the recorded outcome (duplicate) and never run after the
// newer command.
func TestUnreachableIsFinalAgainstReplay(t *testing.T) {
	owner := newCtlKey(t, "ctl-a")
	e := newEnv(t, pump("pump-7"))
	e.extra = securityYAML("", map[*ctlKey][]string{&owner: {"pump-*"}})
	addr := strings.TrimPrefix(e.sim.URL(), "http://")
	e.start()
	captured := mqtttest.Subscribe(t, e.broker, wire.CmdTopic(wire.DefaultPrefix, gw, "pump-7"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: e.broker, Gateway: gw})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.res.watch(t, e.broker, conn.ReplyTopic())
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 5, Holder: "owner"},
		&controller.SendOptions{SignKey: owner.priv, KeyID: owner.id})

	e.sim.Close()
	_, err = s.Send(ctx, "pump-7", "set", map[string]int{"rpm": 3000})
	var re *controller.ResultError
	if !errors.As(err, &re) || re.Result.Code != wire.CodeDeviceUnreachable {
		t.Fatalf("Send A with the device down: %v, want a final device_unreachable", err)
	}
	opA := re.Result.OpID
	a := mqtttest.Await(t, captured, 10*time.Second, func(mqtttest.Received) bool { return true })

	e.restartSim(addr, map[string]string{"pump-7": "pump"})
	if r, err := s.Send(ctx, "pump-7", "set", map[string]int{"rpm": 0}); err != nil || r.Status != wire.StatusApplied {
		t.Fatalf("Send B: %+v %v", r, err)
	}

	e.send("pump-7", a.Payload) // the replay of A's captured bytes
	r := e.result(opA, 2)
	want(t, r, wire.StatusFailed, wire.CodeDeviceUnreachable)
	if !r.Duplicate {
		t.Fatalf("the replay of A was not answered from its record: %+v", r)
	}
	if j := e.journal(); len(j) != 1 || string(j[0].Params) != `{"rpm":0}` {
		t.Fatalf("journal %+v: want only B (rpm 0)", j)
	}
}

// Invariant 8 across a crash, with no attacker: the command ends
// device_unreachable, its Result is published, the agent is killed before
// it acknowledges the delivery (before_ack); the device comes back and the
// agent restarts: the broker redelivers the command, which gets its
// recorded outcome (duplicate), never a second, different final Result.
func TestUnreachableIsFinalAcrossKillBeforeAck(t *testing.T) {
	e := newEnv(t, pump("pump-7"))
	addr := strings.TrimPrefix(e.sim.URL(), "http://")
	e.startProc("EDGE_AGENT_CRASH=before_ack:op-1")
	e.sim.Close()
	e.send("pump-7", cmd("op-1", 3, "set", `{"rpm":3000}`))
	want(t, e.result("op-1", 1), wire.StatusFailed, wire.CodeDeviceUnreachable)
	if code := e.waitExit(20 * time.Second); code != -1 {
		t.Fatalf("agent exited %d, want SIGKILL\n%s", code, e.log())
	}
	e.restartSim(addr, map[string]string{"pump-7": "pump"})
	e.startProc()
	r := e.result("op-1", 2)
	want(t, r, wire.StatusFailed, wire.CodeDeviceUnreachable)
	if !r.Duplicate {
		t.Fatalf("the redelivery was not answered from the record: %+v", r)
	}
	if n := len(e.journal()); n != 0 {
		t.Fatalf("journal has %d entries: the op ran after its final Result", n)
	}
}

// params whose keys are equal under Unicode case folding are invalid
// (docs/protocol.md §1): a device that matches keys without case would
// take another value than the one the policy judged. Here the range
// policy allows rpm 100 while a generic device would take RPM 5000, at
// the top level and nested; nothing reaches the device, and the same
// command without the folded twin is applied.
func TestCaseFoldedParamKeysAreInvalid(t *testing.T) {
	dir := plugins(t)
	e := newEnv(t, withPolicy(dev("gen-1", "generic"), "range-limit", `{param: rpm, min: 0, max: 3000}`))
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()
	for _, tc := range []struct{ op, params string }{
		{"fold-1", `{"rpm":100,"RPM":5000}`},
		{"fold-2", `{"rpm":100,"cfg":{"mode":"a","Mode":"b"}}`},
		{"fold-3", `{"rpm":100,"steps":[{"k":1,"\u212a":2}]}`}, // U+212A KELVIN SIGN folds to k
	} {
		e.send("gen-1", cmd(tc.op, 1, "set", tc.params))
		r := e.final(tc.op)
		want(t, r, wire.StatusRejected, wire.CodeInvalid)
	}
	e.send("gen-1", cmd("plain-1", 1, "set", `{"rpm":100,"mode":"a"}`))
	want(t, e.final("plain-1"), wire.StatusApplied, wire.CodeOK)
	if ops := e.journalOps(); len(ops) != 1 || ops[0] != "plain-1" {
		t.Fatalf("journal %v: want only plain-1", ops)
	}
}

// Invariant 8 for policy_error: the plugin could not decide (its input
// exceeds max_input); a resend of the same op_id gets that recorded
// outcome, duplicate, and nothing reaches the device.
func TestPolicyErrorIsFinal(t *testing.T) {
	dir := plugins(t)
	d := pump("pump-7")
	d.policy = "      plugin: range-limit-c\n      config: {param: rpm, min: 0, max: 3000}\n      limits: {max_input: 2048}\n"
	e := newEnv(t, d)
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()
	c := cmd("perr-1", 10, "set", `{"rpm":100,"note":"`+strings.Repeat("x", 4096)+`"}`)
	e.send("pump-7", c)
	want(t, e.final("perr-1"), wire.StatusRejected, wire.CodePolicyError)
	e.send("pump-7", c)
	r := e.result("perr-1", 2)
	want(t, r, wire.StatusRejected, wire.CodePolicyError)
	if !r.Duplicate {
		t.Fatalf("the resend was handled afresh, not answered from the record: %+v", r)
	}
	if n := len(e.journal()); n != 0 {
		t.Fatalf("journal has %d entries", n)
	}
}

// A keyless publisher cannot end an honest Send with unauthorized: it
// reads the op_id of a signed command on the cmd topic and publishes an
// unsigned command with that op_id. The agent answers that one
// unauthorized, echoing the op_id, on the device's result topic, signed
// by the gateway; the Result names the SHA-256 of the refused payload, so
// the controller package, which takes an unauthorized Result only for its
// own bytes, drops it, and Send returns the honest command's outcome.
func TestForgedUnauthorizedCannotEndAnHonestSend(t *testing.T) {
	owner := newCtlKey(t, "ctl-a")
	gwPrivPEM, gwPubPEM, _ := jws.GenerateKey()
	gwKeyFile := filepath.Join(t.TempDir(), "gateway.key")
	if err := os.WriteFile(gwKeyFile, gwPrivPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	gwPub, _ := jws.ParsePublicKeys(gwPubPEM)
	e := newEnv(t, pump("pump-7"))
	e.extra = securityYAML("  result_key_file: "+gwKeyFile+"\n", map[*ctlKey][]string{&owner: {"pump-*"}})
	e.start()
	setFaults(t, e.sim, sim.Faults{Device: "pump-7", LatencyMS: 700}) // time for the forgery
	cmds := mqtttest.Subscribe(t, e.broker, wire.CmdTopic(wire.DefaultPrefix, gw, "pump-7"))
	results := mqtttest.Subscribe(t, e.broker, wire.ResultTopic(wire.DefaultPrefix, gw, "pump-7"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: e.broker, Gateway: gw, ResultKey: gwPub[0]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 5, Holder: "owner"},
		&controller.SendOptions{SignKey: owner.priv, KeyID: owner.id})

	forged := make(chan string, 1)
	go func() {
		m := mqtttest.Await(t, cmds, 20*time.Second, func(mqtttest.Received) bool { return true })
		tok, err := jws.Parse(m.Payload)
		var c wire.Command
		if err != nil || json.Unmarshal(tok.Payload, &c) != nil {
			forged <- ""
			return
		}
		e.send("pump-7", fmt.Sprintf(`{"op_id":%q,"fence":1,"action":"stop"}`, c.OpID))
		forged <- c.OpID
	}()
	r, err := s.Send(ctx, "pump-7", "set", map[string]int{"rpm": 1200})
	op := <-forged
	if op == "" {
		t.Fatal("the forger did not read the honest command")
	}
	// The forgery was answered, signed by the gateway, with that op_id.
	mqtttest.Await(t, results, 10*time.Second, func(m mqtttest.Received) bool {
		tok, err := jws.Parse(m.Payload)
		var fr wire.Result
		return err == nil && tok.Verify(gwPub[0]) == nil && json.Unmarshal(tok.Payload, &fr) == nil &&
			fr.OpID == op && fr.Code == wire.CodeUnauthorized
	})
	if err != nil || r.Status != wire.StatusApplied || r.OpID != op {
		t.Fatalf("the honest Send: %+v %v, want its own outcome, applied", r, err)
	}
	if ops := e.journalOps(); len(ops) != 1 || ops[0] != op {
		t.Fatalf("journal %v", ops)
	}
}

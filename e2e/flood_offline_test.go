package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// A keyless flood while the agent is offline, against mosquitto running
// the shipped configs/mosquitto.conf. 400 forged commands of ~86 KB for
// pump-a (signed by a key nobody configured, under a configured kid, so
// each one costs a full signature check) are published while the agent
// is down, with a signed command for pump-b after the first 150. The
// broker keeps only what fits in max_queued_bytes (the rest is dropped,
// never queued), and refuses a payload above message_size_limit. When
// the agent returns, pump-b's command is processed before half of the
// forged commands ahead of it are verified: each worker reads its own
// deliveries (lanes.go), so pump-a's backlog does not hold pump-b's
// command. One queue in arrival order verified all 150 first.
func TestForgedBacklogDoesNotDelayAnotherDevice(t *testing.T) {
	const before, after = 150, 250
	owner := newCtlKey(t, "ctl-a")
	// ctl-a in the middle of a rotation: four public keys for one kid
	// (docs/config.md allows up to 4), so a forged command under it is
	// checked against each: the verification, not the transfer, is what
	// the backlog costs.
	pems := owner.pubPEM
	for range 3 {
		pems = append(pems, newCtlKey(t, "old").pubPEM...)
	}
	if err := os.WriteFile(owner.pubFile, pems, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, pump("pump-a"), pump("pump-b"))
	e.extra = securityYAML("", map[*ctlKey][]string{&owner: {"*"}})
	e.adminAt = testkit.FreeAddr(t) // the same across the restart, for the scrape below
	e.start()
	e.stop() // the agent's persistent session stays: the broker queues for it

	rogue := newCtlKeyNoFile(t)
	pad := strings.Repeat("x", 63_000)
	topicA := wire.CmdTopic(wire.DefaultPrefix, gw, "pump-a")
	var toks []paho.Token
	forge := func(i int, pad string) {
		b := signCmd(t, rogue, "ctl-a", "pump-a", cmd(fmt.Sprintf("forged-%d", i), 9, "set", fmt.Sprintf(`{"rpm":1,"pad":%q}`, pad)))
		toks = append(toks, e.sender.Publish(topicA, 1, false, b))
	}
	forge(-1, pad+pad[:8_000]) // ~96 KB: above message_size_limit
	for i := range before {
		forge(i, pad)
	}
	toks = append(toks, e.sender.Publish(wire.CmdTopic(wire.DefaultPrefix, gw, "pump-b"), 1, false,
		signCmd(t, owner, "ctl-a", "pump-b", cmd("legit-b", 7, "set", `{"rpm":1200}`))))
	for i := before; i < before+after; i++ {
		forge(i, pad)
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(60*time.Second) || tok.Error() != nil {
			t.Fatalf("publish #%d: %v", i, tok.Error())
		}
	}

	// How many forged commands the agent has verified (answered or not).
	verified := func() float64 {
		resp, err := http.Get("http://" + e.adminAt + "/metrics")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var n float64
		for _, l := range strings.Split(string(b), "\n") {
			for _, series := range []string{`edge_agent_commands_total{code="unauthorized"} `, "edge_agent_unauthorized_dropped_total "} {
				if v, ok := strings.CutPrefix(l, series); ok {
					f, _ := strconv.ParseFloat(v, 64)
					n += f
				}
			}
		}
		return n
	}
	// Read the count the moment pump-b's Result arrives (in the handler).
	atBc := make(chan float64, 1)
	tok := e.sender.Subscribe(wire.ResultTopic(wire.DefaultPrefix, gw, "pump-b"), 1, func(_ paho.Client, m paho.Message) {
		if strings.Contains(string(m.Payload()), `"legit-b"`) {
			select {
			case atBc <- verified():
			default:
			}
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	e.start()
	want(t, e.result("legit-b", 1), wire.StatusApplied, wire.CodeOK)
	var atB float64
	select {
	case atB = <-atBc:
	case <-time.After(20 * time.Second):
		t.Fatal("pump-b's Result never reached the scraping handler")
	}
	// A command for pump-a sent now is read after the whole backlog of
	// pump-a's lane: once it is answered, every forged one was verified.
	e.send("pump-a", signCmd(t, owner, "ctl-a", "pump-a", cmd("after-a", 7, "set", `{"rpm":10}`)))
	want(t, e.final("after-a"), wire.StatusApplied, wire.CodeOK)
	total := verified()
	t.Logf("forged commands verified: %v when pump-b's command was answered, %v in all (%d published)", atB, total, before+after+1)
	if total < before || total >= before+after {
		t.Fatalf("%v forged commands reached the agent: want the %d before pump-b's command and fewer than all %d (max_queued_bytes drops the rest; message_size_limit the largest)",
			total, before, before+after+1)
	}
	if atB*2 >= before {
		t.Fatalf("pump-b's command was answered after %v of the %d forged commands ahead of it were verified: pump-a's backlog delayed it", atB, before)
	}
}

package e2e

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The controller SDK's side of §6: a Sender with a key signs what the
// agent accepts; without one, the unauthorized Result (which comes on the
// device's result topic, not reply_to) ends its Send at once; a Conn given
// the gateway's public key takes only Results the gateway signed.
func TestSDKSignsAndVerifies(t *testing.T) {
	owner := newCtlKey(t, "ctl-a")
	gwPrivPEM, gwPubPEM, _ := jws.GenerateKey()
	gwKeyFile := filepath.Join(t.TempDir(), "gateway.key")
	os.WriteFile(gwKeyFile, gwPrivPEM, 0o600)
	gwPub, _ := jws.ParsePublicKeys(gwPubPEM)

	e := newEnv(t, pump("pump-7"))
	e.extra = securityYAML("  result_key_file: "+gwKeyFile+"\n", map[*ctlKey][]string{&owner: {"pump-*"}})
	e.start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	dial := func(key ed25519.PublicKey) *controller.Conn {
		c, err := controller.Dial(ctx, controller.ConnOptions{Broker: e.broker, Gateway: gw, ResultKey: key})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	conn := dial(gwPub[0])
	s := controller.NewSender(conn, &controller.FixedFence{Fence: 12, Holder: "sdk"}, &controller.SendOptions{SignKey: owner.priv, KeyID: "ctl-a"})
	r, err := s.Send(ctx, "pump-7", "set", map[string]int{"rpm": 700})
	if err != nil || r.Status != wire.StatusApplied || r.LastFence != 12 {
		t.Fatalf("signed Send: %+v %v", r, err)
	}

	// What the agent published is a JWS by the gateway's key.
	states := mqtttest.Subscribe(t, e.broker, wire.StateTopic(wire.DefaultPrefix, gw, "pump-7"))
	m := mqtttest.Await(t, states, 10*time.Second, func(mqtttest.Received) bool { return true })
	tok, err := jws.Parse(m.Payload)
	if err != nil || tok.Header.Kid != gw || tok.Verify(gwPub[0]) != nil {
		t.Fatalf("retained DeviceState %q is not signed by the gateway: %v", m.Payload, err)
	}

	// Unsigned: unauthorized, answered on the result topic, seen at once.
	plain := controller.NewSender(conn, &controller.FixedFence{Fence: 9223372036854775807, Holder: "rogue"}, nil)
	r, err = plain.Send(ctx, "pump-7", wire.ActionFence, nil)
	var re *controller.ResultError
	if !errors.As(err, &re) || r.Code != wire.CodeUnauthorized {
		t.Fatalf("unsigned Send: %+v %v, want a ResultError unauthorized", r, err)
	}

	// A Conn that trusts another gateway key takes none of these Results.
	_, otherPub, _ := jws.GenerateKey()
	other, _ := jws.ParsePublicKeys(otherPub)
	wrong := dial(other[0])
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	ws := controller.NewSender(wrong, &controller.FixedFence{Fence: 12, Holder: "sdk"}, &controller.SendOptions{SignKey: owner.priv, KeyID: "ctl-a", ResultTimeout: time.Second})
	if _, err := ws.Send(short, "pump-7", "set", map[string]int{"rpm": 800}); !errors.Is(err, controller.ErrOutcomeUnknown) {
		t.Fatalf("Send with the wrong gateway key: %v, want ErrOutcomeUnknown", err)
	}
	testkit.Eventually(t, 5*time.Second, "Results dropped as unverified", func() bool { return wrong.Unverified() > 0 })
	// It was applied all the same (the agent did its part).
	if got := e.journalOps(); len(got) != 2 {
		t.Fatalf("journal %v", got)
	}
}

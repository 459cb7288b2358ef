package controllertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// FleetSender routes each Send by the device directory in a real etcd: to
// the gateway that claims the device now (a claim moved to another gateway
// is followed), over one Conn per gateway with its own controller ID, and
// ErrNoGateway once no gateway claims it. The claims are written by the
// test here, standing in for the agents' (e2e TestFleetDirectory has real
// agents write them); the gateways are responders.
func TestFleetSenderRoutesByDirectory(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	cli := newClient(t, etcdtest.Start(t, 1).Endpoints()...)
	ok := func(cmd wire.Command, _ int) []delayed { return []delayed{{r: result(cmd, wire.CodeOK, cmd.Fence)}} }
	gws := map[string]*responder{"gw-a": startResponder(t, broker, "gw-a", ok), "gw-b": startResponder(t, broker, "gw-b", ok)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claim := func(dev, gw string) {
		t.Helper()
		if _, err := cli.Put(ctx, "fleet/devices/"+dev+"/gateway", gw); err != nil {
			t.Fatal(err)
		}
	}
	claim("d1", "gw-a")
	claim("d2", "gw-b")
	if gw, err := controller.LookupGateway(ctx, cli, "fleet", "d1"); err != nil || gw != "gw-a" {
		t.Fatalf("LookupGateway(d1) = %q, %v", gw, err)
	}
	if _, err := controller.LookupGateway(ctx, cli, "", "d1"); !errors.Is(err, controller.ErrNoGateway) {
		t.Fatalf("LookupGateway under another prefix: %v, want ErrNoGateway", err)
	}
	if _, err := controller.LookupGateway(ctx, cli, "fleet", "a/b"); !errors.Is(err, controller.ErrInvalidCommand) {
		t.Fatalf("LookupGateway of an invalid device ID: %v", err)
	}

	fs := controller.NewFleetSender(cli, "fleet", controller.ConnOptions{Broker: broker, ControllerID: "ctl-fleet"},
		&controller.FixedFence{Fence: 9, Holder: "fleet"}, nil)
	defer fs.Close()
	send := func(dev, op string) {
		t.Helper()
		if r, err := fs.Send(ctx, dev, "set", nil, controller.WithOpID(op)); err != nil || r.Code != wire.CodeOK {
			t.Fatalf("Send %s to %s: %+v %v", op, dev, r, err)
		}
	}
	send("d1", "op-1")
	send("d2", "op-2")
	claim("d1", "gw-b") // the device moved
	send("d1", "op-3")
	want := map[string]string{"gw-a": "op-1", "gw-b": "op-2 op-3"}
	for gw, rs := range gws {
		var ops []string
		for _, s := range rs.seen() {
			ops = append(ops, s.cmd.OpID)
			if !strings.HasSuffix(s.cmd.ReplyTo, "/"+gw+"/controllers/ctl-fleet-"+gw+"/reply") {
				t.Errorf("%s got %s with reply_to %s", gw, s.cmd.OpID, s.cmd.ReplyTo)
			}
		}
		if strings.Join(ops, " ") != want[gw] {
			t.Errorf("%s saw %v, want %s", gw, ops, want[gw])
		}
	}

	if _, err := cli.Delete(ctx, "fleet/devices/d1/gateway"); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Send(ctx, "d1", "set", nil); !errors.Is(err, controller.ErrNoGateway) {
		t.Fatalf("Send to an unclaimed device: %v, want ErrNoGateway", err)
	}
	fs.Close()
	claim("d1", "gw-a")
	if _, err := fs.Send(ctx, "d1", "set", nil); !errors.Is(err, controller.ErrClosed) {
		t.Fatalf("Send after Close: %v, want ErrClosed", err)
	}
}

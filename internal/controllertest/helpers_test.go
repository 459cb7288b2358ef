package controllertest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stateLog records a holder's transitions.
type stateLog struct {
	mu sync.Mutex
	tr []controller.State
}

func (l *stateLog) on(_, to controller.State) {
	l.mu.Lock()
	l.tr = append(l.tr, to)
	l.mu.Unlock()
}

func (l *stateLog) states() []controller.State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]controller.State(nil), l.tr...)
}

func keysUnder(t *testing.T, cli *clientv3.Client, prefix string) []*struct {
	Key   string
	Rev   int64
	Lease int64
} {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("get %s: %v", prefix, err)
	}
	var out []*struct {
		Key   string
		Rev   int64
		Lease int64
	}
	for _, kv := range resp.Kvs {
		out = append(out, &struct {
			Key   string
			Rev   int64
			Lease int64
		}{string(kv.Key), kv.CreateRevision, kv.Lease})
	}
	return out
}

func newClient(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := etcdtest.NewClient(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// responder stands in for the agent in Send's unit tests only: it answers
// each command with whatever the script returns, so the controller's
// reaction to specific Results can be tested. (End-to-end tests use the
// real agent.)
type responder struct {
	t   *testing.T
	cli paho.Client

	mu   sync.Mutex
	cmds []seenCmd
}

type seenCmd struct {
	cmd wire.Command
	at  time.Time
}

// script gets the command and how many times this op_id was seen before;
// each returned Result is published after its delay.
type script func(cmd wire.Command, seen int) []delayed

type delayed struct {
	after time.Duration
	r     wire.Result
}

func result(cmd wire.Command, code wire.Code, lastFence int64) wire.Result {
	return wire.Result{V: 1, OpID: cmd.OpID, Device: deviceOf(cmd), Fence: cmd.Fence,
		Status: wire.StatusOf(code), Code: code, Reason: "test responder", LastFence: lastFence, At: time.Now().UTC()}
}

var cmdDevice sync.Map // op_id -> device, filled by the responder

func deviceOf(cmd wire.Command) string {
	if d, ok := cmdDevice.Load(cmd.OpID); ok {
		return d.(string)
	}
	return ""
}

func startResponder(t *testing.T, broker, gw string, sc script) *responder {
	t.Helper()
	rs := &responder{t: t}
	var wg sync.WaitGroup
	opts := paho.NewClientOptions().AddBroker(broker).SetClientID("responder-" + controller.NewOpID()[:8]).
		SetCleanSession(true).SetOrderMatters(false)
	opts.SetDefaultPublishHandler(func(c paho.Client, m paho.Message) {
		dev, ok := wire.DeviceFromCmdTopic(wire.DefaultPrefix, gw, m.Topic())
		if !ok {
			return
		}
		cmd, err := wire.ParseCommand(m.Payload())
		if err != nil {
			t.Errorf("responder: bad command: %v", err)
			return
		}
		cmdDevice.Store(cmd.OpID, dev)
		rs.mu.Lock()
		seen := 0
		for _, s := range rs.cmds {
			if s.cmd.OpID == cmd.OpID {
				seen++
			}
		}
		rs.cmds = append(rs.cmds, seenCmd{cmd, time.Now()})
		rs.mu.Unlock()
		for _, d := range sc(cmd, seen) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(d.after) // the script's delay, not synchronisation
				b, _ := json.Marshal(d.r)
				c.Publish(cmd.ReplyTo, 1, false, b).Wait()
			}()
		}
	})
	rs.cli = paho.NewClient(opts)
	if tok := rs.cli.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("responder connect: %v", tok.Error())
	}
	if tok := rs.cli.Subscribe(wire.CmdFilter(wire.DefaultPrefix, gw), 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("responder subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { rs.cli.Disconnect(100); wg.Wait() })
	return rs
}

func (rs *responder) seen() []seenCmd {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return append([]seenCmd(nil), rs.cmds...)
}

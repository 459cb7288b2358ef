package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	base := []string{"send", "--broker", "tcp://127.0.0.1:1", "--gateway", "gw", "--device", "pump-7", "--action", "set"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"send", "--nope"}, "unknown flag"},
		{"unknown command", []string{"fly"}, "unknown command"},
		{"no fence source", base, "give --fence N"},
		{"both fence and lock", append(base, "--fence", "3", "--lock", "l", "--etcd", "http://127.0.0.1:1"), "not both"},
		{"fence and etcd", append(base, "--fence", "3", "--etcd", "http://127.0.0.1:1"), "not both"},
		{"lock without etcd", append(base, "--lock", "l"), "go together"},
		{"bad fence", append(base, "--fence", "-4"), "--fence must be"},
		{"bad param", append(base, "--fence", "3", "--param", "rpm"), "KEY=VALUE"},
		{"params equal under case folding", append(base, "--fence", "3", "--param", "rpm=1", "--param", "RPM=2"), "equal under case folding"},
		{"bad device", []string{"send", "--broker", "b", "--gateway", "g", "--device", "a/b", "--action", "set", "--fence", "1"}, "not a valid device"},
		{"bad op id", append(base, "--fence", "3", "--op-id", "has space"), "not a valid op_id"},
		{"missing broker", []string{"send", "--gateway", "g", "--device", "d", "--action", "set", "--fence", "1"}, "--broker is required"},
		{"watch without broker", []string{"watch"}, "required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runCLI(tc.args...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}

func TestParseParams(t *testing.T) {
	cases := []struct {
		in   []string
		want string
	}{
		{[]string{"rpm=1200"}, `{"rpm":1200}`},
		{[]string{"on=true", "name=pump"}, `{"name":"pump","on":true}`},
		{[]string{"s=\"quoted\""}, `{"s":"quoted"}`},
		{[]string{"obj={\"a\":1}"}, `{"obj":{"a":1}}`},
		{[]string{"empty="}, `{"empty":""}`},
		{[]string{"x=a=b"}, `{"x":"a=b"}`},
	}
	for _, tc := range cases {
		got, err := parseParams(tc.in)
		if err != nil || string(got) != tc.want {
			t.Fatalf("parseParams(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestStatusTable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/devices" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode([]wire.DeviceInfo{
			{Device: "pump-7", LastFence: 742, LastOpID: "op-1", QueueDepth: 2, Pending: 1},
			{Device: "valve-1"},
		})
	}))
	defer srv.Close()
	code, out, stderr := runCLI("status", "--admin", srv.URL)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "DEVICE") ||
		strings.Join(strings.Fields(lines[1]), " ") != "pump-7 742 op-1 2 1" ||
		!strings.HasPrefix(lines[2], "valve-1") {
		t.Fatalf("table:\n%s", out)
	}
	code, _, stderr = runCLI("status", "--admin", "http://"+testkit.FreeAddr(t))
	if code != 1 || !strings.Contains(stderr, "admin API") || !strings.Contains(stderr, "unreachable") {
		t.Fatalf("unreachable admin: exit %d, %q", code, stderr)
	}
}

func TestUnreachable(t *testing.T) {
	code, _, stderr := runCLI("send", "--broker", "tcp://"+testkit.FreeAddr(t), "--gateway", "gw",
		"--device", "pump-7", "--action", "stop", "--fence", "1", "--timeout", "3s")
	if code != 1 || !strings.Contains(stderr, "cannot connect to the MQTT broker") {
		t.Fatalf("unreachable broker: exit %d, %q", code, stderr)
	}
	broker := mqtttest.StartMosquitto(t).URL()
	code, _, stderr = runCLI("send", "--broker", broker, "--gateway", "gw", "--device", "pump-7",
		"--action", "stop", "--lock", "locks/x", "--etcd", "http://"+testkit.FreeAddr(t), "--timeout", "5s")
	if code != 1 || !strings.Contains(stderr, "etcd unreachable") {
		t.Fatalf("unreachable etcd: exit %d, %q", code, stderr)
	}
}

// answer stands in for the agent (unit test of the CLI only): it answers
// every command with code, echoing the fence, and records the commands.
func answer(t *testing.T, broker, gw string, code wire.Code, lastFence int64) func() []wire.Command {
	t.Helper()
	var mu sync.Mutex
	var got []wire.Command
	opts := paho.NewClientOptions().AddBroker(broker).SetClientID("answer").SetCleanSession(true)
	opts.SetDefaultPublishHandler(func(c paho.Client, m paho.Message) {
		dev, _ := wire.DeviceFromCmdTopic(wire.DefaultPrefix, gw, m.Topic())
		cmd, err := wire.ParseCommand(m.Payload())
		if err != nil {
			t.Errorf("bad command: %v", err)
			return
		}
		mu.Lock()
		got = append(got, cmd)
		mu.Unlock()
		lf := lastFence
		if lf == 0 {
			lf = cmd.Fence
		}
		b, _ := json.Marshal(wire.Result{V: 1, OpID: cmd.OpID, Device: dev, Fence: cmd.Fence,
			Status: wire.StatusOf(code), Code: code, LastFence: lf, At: time.Now().UTC()})
		go c.Publish(cmd.ReplyTo, 1, false, b)
	})
	cli := paho.NewClient(opts)
	if tok := cli.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	if tok := cli.Subscribe(wire.CmdFilter(wire.DefaultPrefix, gw), 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	t.Cleanup(func() { cli.Disconnect(100) })
	return func() []wire.Command {
		mu.Lock()
		defer mu.Unlock()
		return append([]wire.Command(nil), got...)
	}
}

func TestSendWithLockAndFence(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	c := etcdtest.Start(t, 1)
	cmds := answer(t, broker, "gw-1", wire.CodeOK, 0)

	code, out, stderr := runCLI("send", "--broker", broker, "--gateway", "gw-1", "--device", "pump-7",
		"--action", "set", "--param", "rpm=1200", "--lock", "locks/device/pump-7", "--etcd", c.Endpoints()[0],
		"--op-id", "op-cli-1", "--timeout", "10s")
	if code != 0 {
		t.Fatalf("send --lock: exit %d, %s", code, stderr)
	}
	var r wire.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Status != wire.StatusApplied || r.OpID != "op-cli-1" {
		t.Fatalf("printed result %q (%v)", out, err)
	}
	got := cmds()
	if len(got) != 1 || got[0].Lock != "locks/device/pump-7" || got[0].Fence < 1 || string(got[0].Params) != `{"rpm":1200}` {
		t.Fatalf("commands %+v", got)
	}
	// The lock was released afterwards.
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "locks/device/pump-7/", clientv3WithPrefix())
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("lock keys after send: %v %v", resp, err)
	}

	code, _, _ = runCLI("send", "--broker", broker, "--gateway", "gw-1", "--device", "pump-7",
		"--action", "stop", "--fence", "99", "--lock", "locks/device/pump-7")
	if code != 0 || cmds()[1].Fence != 99 || cmds()[1].Lock != "locks/device/pump-7" {
		t.Fatalf("send --fence: exit %d, %+v", code, cmds())
	}
}

func TestSendNotAppliedExitsOne(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	answer(t, broker, "gw-2", wire.CodeStaleFence, 50)
	code, out, _ := runCLI("send", "--broker", broker, "--gateway", "gw-2", "--device", "pump-7",
		"--action", "stop", "--fence", "3")
	if code != 1 || !strings.Contains(out, `"stale_fence"`) {
		t.Fatalf("stale send: exit %d, out %q", code, out)
	}
}

func clientv3WithPrefix() clientv3.OpOption { return clientv3.WithPrefix() }

func TestWatchPrintsResultsAndStates(t *testing.T) {
	broker := mqtttest.StartMosquitto(t).URL()
	pub := paho.NewClient(paho.NewClientOptions().AddBroker(broker).SetClientID("pub"))
	if tok := pub.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer pub.Disconnect(100)
	// A retained state published before watch starts is delivered on subscribe.
	st, _ := json.Marshal(wire.DeviceState{Device: "pump-7", LastFence: 7, State: json.RawMessage(`{"rpm":5}`)})
	pub.Publish(wire.StateTopic(wire.DefaultPrefix, "gw-w", "pump-7"), 1, true, st).Wait()

	var out lockedWriter
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"watch", "--broker", broker, "--gateway", "gw-w", "--for", "3s"}, &out, &out)
	}()
	res, _ := json.Marshal(wire.Result{V: 1, OpID: "op-w", Device: "pump-7", Status: wire.StatusApplied, Code: wire.CodeOK})
	deadline := time.Now().Add(3 * time.Second)
	for !strings.Contains(out.String(), "op-w") && time.Now().Before(deadline) {
		pub.Publish("edge/gw-w/controllers/ctl-1/reply", 1, false, res).Wait()
		time.Sleep(100 * time.Millisecond)
	}
	if code := <-done; code != 0 {
		t.Fatalf("watch exit %d: %s", code, out.String())
	}
	s := out.String()
	if !strings.Contains(s, "state  edge/gw-w/devices/pump-7/state") || !strings.Contains(s, `"last_fence":7`) ||
		!strings.Contains(s, "result edge/gw-w/controllers/ctl-1/reply") || !strings.Contains(s, `"op_id":"op-w"`) {
		t.Fatalf("watch output:\n%s", s)
	}
}

type lockedWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// --version prints version, commit, build date, Go version and OS/arch.
func TestVersionFlag(t *testing.T) {
	code, out, errb := runCLI("--version")
	want := "edgectl " + Version + " (commit "
	platform := " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + "\n"
	if code != 0 || !strings.HasPrefix(out, want) || !strings.HasSuffix(out, platform) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want %q...%q", code, out, errb, want, platform)
	}
}

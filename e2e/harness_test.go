// Package e2e tests the whole command path: a real mosquitto (or the
// embedded broker), real firmware-sim instances over HTTP, a real bbolt
// store, and the agent in-process or as a real process where a crash is
// involved.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/failpoint"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

const gw = "gw-1"

// binDir holds the plugins built for the tests (policy_test.go).
var binDir string

func TestMain(m *testing.M) {
	var err error
	if binDir, err = os.MkdirTemp("", "edge-agent-e2e"); err != nil {
		panic(err)
	}
	testkit.Main(m, func() { os.RemoveAll(binDir) }, stopSharedNATS)
}

// devSpec is one device of a test gateway.
type devSpec struct {
	id, typ    string
	queue      int
	timeout    string
	retries    int
	idempotent bool
	queryable  bool
	lock       string
	group      string
	policy     string // raw YAML of the policy block, indented by 6
	driver     string // extra raw YAML of the driver block, indented by 6
	url        string // the driver's url; "": the simulator's
	// modbus, when set, makes the device kind: modbus on the simulator's
	// Modbus listener (url and unit_id filled in): the rest of the driver
	// block, indented by 6.
	modbus string
	// modbusRTU puts a modbus device on the simulator's RTU-over-TCP
	// listener instead (url: rtuovertcp://).
	modbusRTU bool
	// settle is the driver's resolve_settle; "": 0s (a test answers for
	// a held write as soon as it is held), "default": the key is left out.
	settle string
}

func pump(id string) devSpec {
	return devSpec{id: id, typ: "pump", timeout: "1s", idempotent: true, queryable: true}
}

// env is one gateway under test.
type env struct {
	t       testing.TB
	broker  string // tcp://...
	mosq    *mqtttest.Mosquitto
	sim     *sim.Sim
	devs    []devSpec
	dataDir string
	cfgPath string
	extra   string // extra top-level YAML
	brokers string // mqtt.brokers, a YAML flow list; "": mqtt.broker is broker
	prefix  string // mqtt.topic_prefix; "": wire.DefaultPrefix
	// clientID is mqtt.client_id; "": edge-agent-e2e.
	clientID string
	adminAt  string // admin.listen; "": 127.0.0.1:0

	app  *app.App
	proc *testkit.Proc // the agent process (startProc); nil once it exited
	plog string        // the last agent process's output, once it exited

	// failCommit is the in-process agent's store fault hook (nil: none),
	// the failpoint "commit": a test that sets it is skipped unless the
	// test binary is built with -tags failpoints (make test does).
	failCommit func() error

	res     *collector
	sender  paho.Client
	status  <-chan mqtttest.Received
	started bool
}

// waitOnline waits for the gateway's status to say online.
func (e *env) waitOnline() {
	e.t.Helper()
	mqtttest.Await(e.t, e.status, 20*time.Second, func(m mqtttest.Received) bool {
		var s wire.GatewayStatus
		return json.Unmarshal(m.Payload, &s) == nil && s.State == "online"
	})
}

// newEnv is a gateway on its own mosquitto.
func newEnv(t testing.TB, devs ...devSpec) *env {
	t.Helper()
	return newEnvOn(t, onMosquitto, devs...)
}

// newEnvOn is a gateway on broker b: its own mosquitto, or the shared
// NATS cluster (nats_test.go), where the agent is given every node, first
// node first, and the test's clients use the second node, with a topic
// prefix and client ID of the test's own.
func newEnvOn(t testing.TB, b brokerKind, devs ...devSpec) *env {
	t.Helper()
	e := &env{t: t, devs: devs, dataDir: filepath.Join(t.TempDir(), "data")}
	switch b {
	case onMosquitto:
		e.mosq = mqtttest.StartMosquitto(t)
		e.broker = e.mosq.URL()
	case onNATS:
		urls := sharedNATS(t).URLs()
		e.broker = urls[1]
		e.brokers = "[" + strings.Join(urls, ", ") + "]"
		e.prefix = fmt.Sprintf("e2e%d", natsEnvs.Add(1))
		e.clientID = "edge-agent-" + e.prefix
	default:
		t.Fatalf("no broker %q", b)
	}
	types := map[string]string{}
	for _, d := range devs {
		types[d.id] = d.typ
	}
	e.sim = sim.StartForTest(t, types)
	var tcp, rtu bool
	for _, d := range devs {
		tcp = tcp || d.modbus != "" && !d.modbusRTU
		rtu = rtu || d.modbus != "" && d.modbusRTU
	}
	if tcp {
		if err := e.sim.StartModbus("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	if rtu {
		if err := e.sim.StartModbusRTU("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	e.res = newCollector(t, e.broker, e.pfx())
	e.status = mqtttest.Subscribe(t, e.broker, wire.StatusTopic(e.pfx(), gw))
	e.sender = connect(t, e.broker, fmt.Sprintf("e2e-sender-%d", time.Now().UnixNano()))
	return e
}

// pfx is the gateway's topic prefix.
func (e *env) pfx() string {
	if e.prefix == "" {
		return wire.DefaultPrefix
	}
	return e.prefix
}

func (e *env) writeConfig() string {
	var b strings.Builder
	brokerKey := "broker: " + e.broker
	if e.brokers != "" {
		brokerKey = "brokers: " + e.brokers
	}
	clientID := e.clientID
	if clientID == "" {
		clientID = "edge-agent-e2e"
	}
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  %s\n  client_id: %s\n", gw, e.dataDir, brokerKey, clientID)
	if e.prefix != "" {
		fmt.Fprintf(&b, "  topic_prefix: %s\n", e.prefix)
	}
	adminAt := e.adminAt
	if adminAt == "" {
		adminAt = "127.0.0.1:0"
	}
	fmt.Fprintf(&b, "admin:\n  listen: %s\nshutdown_timeout: 5s\n", adminAt)
	b.WriteString(e.extra)
	b.WriteString("devices:\n")
	for _, d := range e.devs {
		fmt.Fprintf(&b, "  - id: %s\n    type: %s\n", d.id, d.typ)
		if d.queue > 0 {
			fmt.Fprintf(&b, "    queue: %d\n", d.queue)
		}
		if d.lock != "" {
			fmt.Fprintf(&b, "    lock: %s\n", d.lock)
		}
		if d.group != "" {
			fmt.Fprintf(&b, "    group: %s\n", d.group)
		}
		if d.modbus != "" {
			u, _ := e.sim.Unit(d.id)
			url := "tcp://" + e.sim.ModbusAddr()
			if d.modbusRTU {
				url = "rtuovertcp://" + e.sim.ModbusRTUAddr()
			}
			fmt.Fprintf(&b, "    driver:\n      kind: modbus\n      url: %s\n      unit_id: %d\n%s", url, u, d.modbus)
		} else {
			url := d.url
			if url == "" {
				url = e.sim.URL()
			}
			fmt.Fprintf(&b, "    driver:\n      url: %s\n      timeout: %s\n      retries: %d\n      idempotent: %v\n      queryable: %v\n",
				url, d.timeout, d.retries, d.idempotent, d.queryable)
		}
		switch d.settle {
		case "default":
		case "":
			b.WriteString("      resolve_settle: 0s\n")
		default:
			fmt.Fprintf(&b, "      resolve_settle: %s\n", d.settle)
		}
		b.WriteString(d.driver)
		if d.policy != "" {
			b.WriteString("    policy:\n" + d.policy)
		}
	}
	if e.cfgPath == "" {
		e.cfgPath = filepath.Join(e.t.TempDir(), "agent.yaml")
	}
	if err := os.WriteFile(e.cfgPath, []byte(b.String()), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return e.cfgPath
}

// start runs the agent in-process and waits until it is subscribed.
func (e *env) start() *app.App {
	e.t.Helper()
	cfg, err := config.Load(e.writeConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if e.failCommit != nil {
		restore, err := failpoint.SetFunc(failpoint.Commit, e.failCommit)
		if err != nil {
			e.t.Skip(err)
		}
		e.t.Cleanup(restore)
	}
	a := app.New(cfg, app.Options{Logger: log, Version: "e2e"})
	if err := a.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.app = a
	e.t.Cleanup(func() { e.stop() })
	testkit.Eventually(e.t, 10*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })
	return a
}

// stop drains the in-process agent.
func (e *env) stop() {
	if e.app == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.app.Stop(ctx)
	e.app = nil
}

// startProc runs the agent as a real process with extra environment.
func (e *env) startProc(envv ...string) {
	e.t.Helper()
	cfg := e.writeConfig()
	e.proc = testkit.StartProc(e.t, testkit.ProcOptions{Env: envv, StopSignal: syscall.SIGKILL},
		testkit.Build(e.t, "../cmd/edge-agent", "failpoints"), "run", "--config", cfg, "--log-level", "warn")
	if !e.started {
		// First start: the agent's broker session does not exist until it
		// subscribes, so wait for its retained "online" status.
		e.started = true
		e.waitOnline()
	}
}

// log is the agent process's output so far (or the last one's, once it
// exited).
func (e *env) log() string {
	if e.proc != nil {
		return e.proc.Log()
	}
	return e.plog
}

// waitExit waits for the agent process to end and returns its exit code
// (-1 when killed by a signal).
func (e *env) waitExit(within time.Duration) int {
	e.t.Helper()
	code, ok := e.proc.Wait(within)
	if !ok {
		e.t.Fatalf("agent process still running after %s\n%s", within, e.proc.Log())
	}
	e.plog, e.proc = e.proc.Log(), nil
	return code
}

// send publishes a command (QoS 1) on the device's cmd topic.
func (e *env) send(dev string, c any) {
	e.t.Helper()
	var b []byte
	switch v := c.(type) {
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			e.t.Fatal(err)
		}
	}
	tok := e.sender.Publish(wire.CmdTopic(e.pfx(), gw, dev), 1, false, b)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		e.t.Fatalf("publish: %v", tok.Error())
	}
}

func cmd(op string, fence int64, action string, params string) wire.Command {
	c := wire.Command{OpID: op, Fence: fence, Action: action}
	if params != "" {
		c.Params = json.RawMessage(params)
	}
	return c
}

// result waits for the n-th (1-based) Result of op on the result topics.
func (e *env) result(op string, n int) wire.Result {
	e.t.Helper()
	return e.res.wait(op, n, 20*time.Second)
}

// final waits for op's first Result that is not unknown.
func (e *env) final(op string) wire.Result {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; ; i++ {
		r := e.res.wait(op, i, time.Until(deadline))
		if r.Status != wire.StatusUnknown {
			return r
		}
	}
}

func (e *env) journal() []sim.Entry { return e.sim.Journal() }

func (e *env) journalOps() []string {
	var ops []string
	for _, j := range e.journal() {
		ops = append(ops, j.OpID)
	}
	return ops
}

func (e *env) admin(path string) (int, []byte) {
	e.t.Helper()
	addr := e.adminAt // an agent process (startProc) with a fixed admin address
	if e.app != nil {
		addr = e.app.AdminAddr()
	}
	if addr == "" {
		e.t.Fatal("e2e: admin: no agent in process, and no adminAt for the agent process")
	}
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// collector gathers every Result published on the gateway's result topics
// (and any extra topics) by op_id.
type collector struct {
	t    testing.TB
	mu   sync.Mutex
	cond *sync.Cond
	by   map[string][]wire.Result
	all  atomic.Int64
}

func newCollector(t testing.TB, url, prefix string) *collector {
	c := &collector{t: t, by: map[string][]wire.Result{}}
	c.cond = sync.NewCond(&c.mu)
	c.watch(t, url, wire.ResultFilter(prefix, gw))
	return c
}

func (c *collector) watch(t testing.TB, url, filter string) {
	ch := mqtttest.Subscribe(t, url, filter)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-stop:
				return
			case m := <-ch:
				var r wire.Result
				if json.Unmarshal(m.Payload, &r) != nil {
					continue
				}
				c.mu.Lock()
				c.by[r.OpID] = append(c.by[r.OpID], r)
				c.all.Add(1)
				c.cond.Broadcast()
				c.mu.Unlock()
			}
		}
	}()
}

func (c *collector) count(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.by[op])
}

// results returns op's Results received so far.
func (c *collector) results(op string) []wire.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]wire.Result(nil), c.by[op]...)
}

func (c *collector) wait(op string, n int, within time.Duration) wire.Result {
	deadline := time.Now().Add(within)
	timer := time.AfterFunc(within, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer timer.Stop()
	c.t.Helper()
	c.mu.Lock()
	for len(c.by[op]) < n {
		if time.Now().After(deadline) {
			have := fmt.Sprint(c.by[op])
			c.mu.Unlock()
			c.t.Fatalf("no Result #%d for op %q within %s (have %s)", n, op, within, have)
		}
		c.cond.Wait()
	}
	defer c.mu.Unlock()
	return c.by[op][n-1]
}

func connect(t testing.TB, url, id string) paho.Client {
	o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).
		SetAutoReconnect(true).SetConnectTimeout(5 * time.Second).SetMaxResumePubInFlight(1000)
	c := paho.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("connect %s: %v", url, tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type (
	pahoClient  = paho.Client
	pahoMessage = paho.Message
)

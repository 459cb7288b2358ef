package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/rig"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// The agent on a real broker cluster: three nats-server nodes with
// JetStream and their MQTT interface (docs/protocol.md §9,
// docs/operations.md "What the agent needs of a broker").

// brokerKind is what a test's gateway runs on (newEnvOn).
type brokerKind string

const (
	onMosquitto brokerKind = "mosquitto"
	onNATS      brokerKind = "nats"
)

// forEachBroker runs a core case on mosquitto and on the NATS cluster,
// as subtests named by the broker.
func forEachBroker(t *testing.T, f func(t *testing.T, b brokerKind)) {
	for _, b := range []brokerKind{onMosquitto, onNATS} {
		t.Run(string(b), func(t *testing.T) { f(t, b) })
	}
}

var (
	shared struct {
		mu  sync.Mutex
		c   *rig.NATSCluster
		dir string
		err error
	}
	natsEnvs atomic.Int64 // gives each env on the shared cluster its prefix
)

// sharedNATS is the 3-node NATS cluster the core cases share (started by
// the first one, in about 10 s, stopped after the package's tests): each
// env on it has its own topic prefix and client ID, so no test sees
// another's sessions or retained messages. A test that kills nodes starts
// a cluster of its own (mqtttest.StartNATS).
func sharedNATS(t testing.TB) *rig.NATSCluster {
	t.Helper()
	if _, err := rig.FindNATS(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c == nil && shared.err == nil {
		shared.dir, shared.err = os.MkdirTemp("", "edge-agent-e2e-nats")
		if shared.err == nil {
			shared.c, shared.err = rig.StartNATS(rig.NATSOptions{Dir: shared.dir})
		}
	}
	if shared.err != nil {
		t.Fatalf("the shared NATS cluster: %v", shared.err)
	}
	for i, n := range shared.c.Nodes {
		if !n.Running() {
			t.Fatalf("shared NATS node %s is not running:\n%s", n.Name, shared.c.Log(i, 3000))
		}
	}
	return shared.c
}

func stopSharedNATS() {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.c != nil {
		shared.c.Stop()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
}

// startGatewayOn runs an agent process as gateway id with brokers (in
// this order) fronting devs (pumps on the simulator), and waits until it
// is ready.
func startGatewayOn(t *testing.T, id string, brokers []string, simURL string, devs ...string) *testkit.Proc {
	t.Helper()
	dir := t.TempDir()
	admin := testkit.FreeAddr(t)
	var b strings.Builder
	fmt.Fprintf(&b, "gateway_id: %s\ndata_dir: %s\nmqtt:\n  brokers: [%s]\nadmin:\n  listen: %s\nshutdown_timeout: 5s\ndevices:\n",
		id, filepath.Join(dir, "data"), strings.Join(brokers, ", "), admin)
	for _, d := range devs {
		fmt.Fprintf(&b, "  - id: %s\n    type: pump\n    driver: {url: %s, timeout: 1s, idempotent: true, queryable: true, resolve_settle: 0s}\n", d, simURL)
	}
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testkit.StartProc(t, testkit.ProcOptions{StopSignal: syscall.SIGKILL},
		testkit.Build(t, "../cmd/edge-agent", "failpoints"), "run", "--config", cfg, "--log-level", "warn")
	testkit.Eventually(t, 60*time.Second, id+" ready", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// rotate is urls starting at index i.
func rotate(urls []string, i int) []string {
	i %= len(urls)
	return append(slices.Clone(urls[i:]), urls[:i]...)
}

// Three gateways on the NATS cluster, each with its own first node, and a
// controller per gateway on the next node: commands go to every device
// while node 1 is killed (the agent and the controller on it move on) and
// restarted. Every Send ends with a final Result (applied), the firmware
// journal holds every command exactly once and in the order sent (none
// applied twice: invariant 2; none lost), and commands completed on every
// device while node 1 was down.
func TestFleetOnNATSCluster(t *testing.T) {
	nats := mqtttest.StartNATS(t, rig.NATSOptions{})
	urls := nats.URLs()
	gws := []string{"gw-a", "gw-b", "gw-c"}
	devsOf := map[string][]string{}
	types := map[string]string{}
	for _, g := range gws {
		for k := 1; k <= 2; k++ {
			d := fmt.Sprintf("%s-pump-%d", strings.TrimPrefix(g, "gw-"), k)
			devsOf[g] = append(devsOf[g], d)
			types[d] = "pump"
		}
	}
	s := sim.StartForTest(t, types)
	procs := map[string]*testkit.Proc{}
	for i, g := range gws {
		procs[g] = startGatewayOn(t, g, rotate(urls, i), s.URL(), devsOf[g]...)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type devRun struct {
		mu        sync.Mutex
		sent      []string // op_ids, in send order
		done      int      // Sends that returned
		errs      []string
		whileDown int // Sends that ended while node 1 was down
	}
	runs := map[string]*devRun{}
	var down atomic.Bool
	var stop atomic.Bool
	var (
		wg      sync.WaitGroup
		senders []*controller.Sender
		conns   []*controller.Conn
	)
	for i, g := range gws {
		conn, err := controller.Dial(ctx, controller.ConnOptions{Brokers: rotate(urls, i+1), Gateway: g,
			ConnectTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		sender := controller.NewSender(conn, &controller.FixedFence{Fence: 10, Holder: "nats-" + g}, &controller.SendOptions{ResultTimeout: 3 * time.Second})
		senders, conns = append(senders, sender), append(conns, conn)
		for _, d := range devsOf[g] {
			r := &devRun{}
			runs[d] = r
			wg.Go(func() {
				for k := 1; !stop.Load(); k++ {
					op := fmt.Sprintf("%s-%d", d, k)
					r.mu.Lock()
					r.sent = append(r.sent, op)
					r.mu.Unlock()
					sctx, scancel := context.WithTimeout(ctx, 90*time.Second)
					res, err := sender.Send(sctx, d, "set", map[string]int{"rpm": k}, controller.WithOpID(op))
					scancel()
					r.mu.Lock()
					r.done++
					if err != nil || res.Status != wire.StatusApplied || res.Code != wire.CodeOK {
						r.errs = append(r.errs, fmt.Sprintf("%s: %+v %v", op, res, err))
					}
					if down.Load() && err == nil {
						r.whileDown++
					}
					r.mu.Unlock()
					if err != nil {
						return
					}
				}
			})
		}
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for d, r := range runs {
			r.mu.Lock()
			t.Logf("%s: %d sent, %d done, %d while node 1 was down, last %s, errors %v",
				d, len(r.sent), r.done, r.whileDown, r.sent[len(r.sent)-1], r.errs)
			r.mu.Unlock()
		}
		for i, s := range senders {
			t.Logf("%s's controller: connected %v, %+v", gws[i], conns[i].Connected(), s.Stats())
		}
	})
	progress := func(min int, field func(*devRun) int) func() bool {
		return func() bool {
			for _, r := range runs {
				r.mu.Lock()
				n := field(r)
				r.mu.Unlock()
				if n < min {
					return false
				}
			}
			return true
		}
	}
	doneOf := func(r *devRun) int { return r.done }
	testkit.Eventually(t, 60*time.Second, "3 commands done on every device", progress(3, doneOf))

	t0 := time.Now()
	nats.Kill(0) // gw-a's first node, and gw-c's controller's
	down.Store(true)
	testkit.Eventually(t, 90*time.Second, "3 commands done on every device with node 1 down",
		progress(3, func(r *devRun) int { return r.whileDown }))
	t.Logf("every device had 3 commands done %s after node 1 was killed", time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	nats.Restart(0)
	down.Store(false)
	t.Logf("node 1 accepted MQTT clients %s after its restart", time.Since(t0).Round(time.Millisecond))
	before := map[string]int{}
	for d, r := range runs {
		r.mu.Lock()
		before[d] = r.done
		r.mu.Unlock()
	}
	testkit.Eventually(t, 60*time.Second, "3 more commands done on every device after the restart", func() bool {
		for d, r := range runs {
			r.mu.Lock()
			n := r.done
			r.mu.Unlock()
			if n < before[d]+3 {
				return false
			}
		}
		return true
	})
	stop.Store(true)
	wg.Wait()

	total := 0
	for _, g := range gws {
		if !procs[g].Running() {
			t.Errorf("%s exited: %s\n%s", g, procs[g].Ended(), procs[g].Log())
		}
	}
	journal := map[string][]string{}
	for _, j := range s.Journal() {
		journal[j.Device] = append(journal[j.Device], j.OpID)
	}
	for d, r := range runs {
		if len(r.errs) > 0 {
			t.Errorf("%s: %d Sends without a final applied Result: %v", d, len(r.errs), r.errs)
		}
		total += len(r.sent)
		if !slices.Equal(journal[d], r.sent) {
			t.Errorf("%s: firmware journal %v, want each command sent once, in order: %v", d, journal[d], r.sent)
		}
	}
	t.Logf("%d commands on %d devices of %d gateways, each applied once", total, len(runs), len(gws))
}

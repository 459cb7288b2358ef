package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/agent"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/store"
)

// applyAll is a device that applies every write.
type applyAll struct{}

func (applyAll) Apply(_ context.Context, w device.Write) device.WriteResult {
	return device.WriteResult{Outcome: device.Applied, State: w.Params, Tries: 1}
}
func (applyAll) Query(context.Context, string, string) (device.QueryResult, error) {
	return device.QueryResult{Applied: true}, nil
}
func (applyAll) Queryable(string) bool { return true }

type ackedPublisher struct{}

type acked struct{}

func (acked) Done() <-chan struct{} { c := make(chan struct{}); close(c); return c }
func (acked) Err() error            { return nil }

func (ackedPublisher) PublishAsync(context.Context, string, []byte, bool) (agent.Pending, error) {
	return acked{}, nil
}

// testServer is the admin API of a running agent (one queryable device,
// pump-1, over a bbolt file in t.TempDir()).
func testServer(t *testing.T, o Options) (*agent.Agent, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`gateway_id: gw-t
data_dir: %s
mqtt: {broker: "tcp://127.0.0.1:1"}
devices:
  - {id: pump-1, type: pump, driver: {url: "http://127.0.0.1:9", idempotent: true, queryable: true}}
`, dir)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(dir, "agent.db"), &store.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	st.Start()
	gw := agent.Gateway{GatewayID: cfg.GatewayID, TopicPrefix: cfg.MQTT.TopicPrefix, Retention: cfg.Dedup.Retention.D(), KeepLast: cfg.Dedup.KeepLast}
	d := cfg.Devices[0]
	devs := []agent.Device{{ID: d.ID, Type: d.Type, Worker: d.WorkerID(), Queue: d.Queue, Resends: d.Driver.Resends, Timeout: time.Second}}
	a, err := agent.New(agent.Options{Gateway: gw, Devices: devs, Store: st, Publisher: ackedPublisher{},
		Drivers: map[string]device.Driver{"pump-1": applyAll{}}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(Handler(a, o))
	t.Cleanup(func() {
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		a.Stop(ctx)
		st.Close()
	})
	return a, srv
}

func get(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
	return resp.StatusCode
}

// The routes answer with the documented codes (docs/protocol.md §3): 404
// for what does not exist, 400 for a malformed query, 409 for a resolve
// the agent does itself.
func TestHandlerCodes(t *testing.T) {
	_, srv := testServer(t, Options{Version: "t1", MQTTConnected: func() bool { return true }})
	for _, tt := range []struct {
		path string
		want int
	}{
		{"/healthz", 200}, {"/readyz", 200}, {"/metrics", 200}, {"/", 200},
		{"/v1/devices", 200}, {"/v1/devices/pump-1", 200}, {"/v1/devices/nope", 404},
		{"/v1/devices/pump-1/ops/nope", 404}, {"/v1/devices/pump-1/ops?limit=0", 400},
		{"/v1/devices/pump-1/ops?before=x", 400}, {"/v1/devices/pump-1/ops", 200},
		{"/v1/ops?status=final", 400}, {"/v1/ops?status=unknown", 200},
		{"/v1/stats?seconds=0", 400}, {fmt.Sprintf("/v1/stats?seconds=%d", agent.StatSeconds+1), 400},
		{"/v1/stats?seconds=5", 200}, {"/v1/events?max_rate=0", 400}, {"/v1/status", 200},
	} {
		resp, err := http.Get(srv.URL + tt.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("GET %s: %d, want %d", tt.path, resp.StatusCode, tt.want)
		}
	}
	resp, err := http.Post(srv.URL+"/v1/devices/pump-1/ops/x/resolve", "application/json", strings.NewReader(`{"applied":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("resolve on a queryable device: %d, want 409", resp.StatusCode)
	}
	var st GatewayStatus
	if get(t, srv.URL+"/v1/status", &st); st.Gateway != "gw-t" || st.Version != "t1" || !st.MQTTConnected || !st.StoreOK || !st.Ready || st.Plugins == nil {
		t.Errorf("status %+v", st)
	}
}

// A command's Result reaches an open /v1/events stream as a "result"
// event, and the stream counts in the status.
func TestEventsStreamCarriesResults(t *testing.T) {
	a, srv := testServer(t, Options{})
	resp, err := http.Get(srv.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	var st GatewayStatus
	if get(t, srv.URL+"/v1/status", &st); st.EventClients != 1 {
		t.Fatalf("status counts %d event clients, want 1", st.EventClients)
	}
	b, _ := json.Marshal(wire.Command{OpID: "op-1", Fence: 1, Action: "set", Params: json.RawMessage(`{"rpm":1}`)})
	a.Deliver(agent.Delivery{Topic: wire.CmdTopic(wire.DefaultPrefix, "gw-t", "pump-1"), Payload: b, Ack: func() {}})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(10 * time.Second)
	for kind := ""; ; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the stream ended")
			}
			if k, found := strings.CutPrefix(l, "event: "); found {
				kind = k
			}
			if d, found := strings.CutPrefix(l, "data: "); found && kind == "result" {
				var r wire.Result
				if err := json.Unmarshal([]byte(d), &r); err != nil || r.OpID != "op-1" || r.Code != wire.CodeOK {
					t.Fatalf("result event %s: %+v, %v", d, r, err)
				}
				return
			}
		case <-deadline:
			t.Fatal("no result event")
		}
	}
}

package policy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// logBuffer collects a Host's log lines for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type testHost struct {
	*Host
	logs *logBuffer
	reg  *prometheus.Registry
}

// newTestHost returns a Host with a fresh registry and a captured log. The
// call deadline defaults to 1s, not 50ms: CI machines are shared and slow,
// and only the tests about deadlines need a short one (they set it).
func newTestHost(t testing.TB, opts HostOptions) *testHost {
	t.Helper()
	logs := &logBuffer{}
	reg := prometheus.NewRegistry()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.Registerer == nil {
		opts.Registerer = reg
	}
	if opts.Defaults.Timeout == 0 {
		opts.Defaults.Timeout = time.Second
	}
	h := &testHost{Host: NewHost(opts), logs: logs, reg: reg}
	t.Cleanup(func() {
		if err := h.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

func (h *testHost) bind(t testing.TB, device, plugin, config string) {
	t.Helper()
	b := Binding{Path: pluginPath(t, plugin), Plugin: plugin}
	if config != "" {
		b.Config = json.RawMessage(config)
	}
	if err := h.Bind(device, b); err != nil {
		t.Fatal(err)
	}
}

func (h *testHost) start(t testing.TB) {
	t.Helper()
	if err := h.Start(context.Background()); err != nil {
		t.Fatalf("Start: %v", err)
	}
}

func (h *testHost) counter(t testing.TB, c *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	return testutil.ToFloat64(c.WithLabelValues(labels...))
}

// cmd builds an input for device with the given action and params.
func cmd(device, action, params string) Input {
	in := Input{
		Device:    DeviceRef{ID: device, Type: "pump"},
		Command:   CommandView{OpID: "op-1", Fence: 7, Action: action, Holder: "ctl-a"},
		LastFence: 6,
		Now:       time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
	}
	if params != "" {
		in.Command.Params = json.RawMessage(params)
	}
	return in
}

func mustContain(t testing.TB, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Fatalf("%q does not contain %q", s, sub)
	}
}

var (
	sharedCacheOnce sync.Once
	sharedCacheDir  string
)

// sharedCache is a compilation cache shared by the tests, kept in the
// user's cache directory across runs (wazero keys its entries by its own
// version and the module's hash), so each plugin is compiled once per
// machine: under -race, compiling one Go plugin takes tens of seconds. The
// tests about the cache itself use their own.
func sharedCache(t testing.TB) string {
	sharedCacheOnce.Do(func() {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		sharedCacheDir = filepath.Join(base, "edge-agent-policy-test", "wazero")
		if err := os.MkdirAll(sharedCacheDir, 0o755); err != nil {
			panic(err)
		}
	})
	return sharedCacheDir
}

func gaugeValue(g interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

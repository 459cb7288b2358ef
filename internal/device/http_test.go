package device_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/device"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

var simDevices = map[string]string{"pump-7": "pump", "valve-1": "valve", "gen-1": "generic"}

func newDriver(t testing.TB, opts device.HTTPOptions) *device.HTTP {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	d, err := device.NewHTTP(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// driverFor is a driver with one device, pump-7 unless named, at url.
func driverFor(t testing.TB, url string, cfg device.HTTPDevice, devs ...string) *device.HTTP {
	t.Helper()
	cfg.URL = url
	if len(devs) == 0 {
		devs = []string{"pump-7"}
	}
	m := map[string]device.HTTPDevice{}
	for _, dev := range devs {
		m[dev] = cfg
	}
	return newDriver(t, device.HTTPOptions{Devices: m})
}

func write(key string, params string) device.Write {
	return device.Write{Device: "pump-7", OpID: "op-" + key, Key: key, Fence: 42, Action: "set", Params: json.RawMessage(params)}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t testing.TB) string {
	t.Helper()
	return "http://" + testkit.FreeAddr(t)
}

func wantResult(t testing.TB, got device.WriteResult, outcome device.Outcome, tries int, reason string) {
	t.Helper()
	if got.Outcome != outcome || got.Tries != tries || !strings.Contains(got.Reason, reason) {
		t.Fatalf("result = %s, %d tries, reason %q; want %s, %d tries, reason containing %q",
			got.Outcome, got.Tries, got.Reason, outcome, tries, reason)
	}
}

func setFaults(t testing.TB, s *sim.Sim, f sim.Faults) {
	t.Helper()
	if err := s.SetFaults(f); err != nil {
		t.Fatal(err)
	}
}

func TestApplyApplied(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	d := driverFor(t, s.URL()+"/", device.HTTPDevice{})
	res := d.Apply(t.Context(), write("k1", `{"rpm":1200}`))
	wantResult(t, res, device.Applied, 1, "")
	if string(res.State) != `{"rpm":1200}` {
		t.Fatalf("state = %s", res.State)
	}
	j := s.Journal()
	if len(j) != 1 {
		t.Fatalf("journal = %+v", j)
	}
	// What the device got: key and fence headers, op_id, action and params.
	if e := j[0]; e.Key != "k1" || e.Fence != 42 || e.OpID != "op-k1" || e.Action != "set" || string(e.Params) != `{"rpm":1200}` {
		t.Fatalf("journal entry = %+v", e)
	}
	// Nil params are sent as {}.
	res = d.Apply(t.Context(), device.Write{Device: "pump-7", OpID: "o2", Key: "k2", Fence: 43, Action: "stop"})
	wantResult(t, res, device.Applied, 1, "")
	if string(res.State) != `{"rpm":0}` || string(s.Journal()[1].Params) != `{}` {
		t.Fatalf("state = %s, journal = %+v", res.State, s.Journal())
	}
}

func TestApplyRefused(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 3, Idempotent: true}, "pump-7", "pump-9")
	// A 4xx is definite: never retried, whatever the configuration.
	wantResult(t, d.Apply(t.Context(), write("k1", `{"rpm":7000}`)), device.Refused, 1, "rpm: must be an integer 0..6000, got 7000")
	if got := s.Requests("pump-7", "k1"); got != 1 {
		t.Fatalf("Requests = %d, want 1", got)
	}
	// A device the firmware does not know: 404 on apply is a refusal.
	w := write("k2", `{"rpm":1}`)
	w.Device = "pump-9"
	wantResult(t, d.Apply(t.Context(), w), device.Refused, 1, `unknown device "pump-9"`)
	if j := s.Journal(); len(j) != 0 {
		t.Fatalf("journal = %+v", j)
	}
}

func TestApplyNotSent(t *testing.T) {
	url := closedPort(t)
	for _, idempotent := range []bool{false, true} {
		t.Run(fmt.Sprint("idempotent=", idempotent), func(t *testing.T) {
			// A try that could not connect never reached the device: it
			// is retried even when the device does not honour keys.
			d := driverFor(t, url, device.HTTPDevice{Retries: 2, Idempotent: idempotent})
			wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1}`)), device.NotSent, 3, "connection refused")
		})
	}
}

func TestApplyUnknownByTimeout(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 600})
	// Not idempotent: a try that timed out after sending is not retried.
	d := driverFor(t, s.URL(), device.HTTPDevice{Timeout: 100 * time.Millisecond, Retries: 2, Queryable: true})
	res := d.Apply(t.Context(), write("k", `{"rpm":1200}`))
	wantResult(t, res, device.Unknown, 1, "may have reached the device: no answer within 100ms")
	if got := s.Requests("pump-7", "k"); got != 1 {
		t.Fatalf("Requests = %d, want 1", got)
	}
	// The write is still in its latency: the device waits with the query
	// too, longer than the driver's timeout.
	if _, err := d.Query(t.Context(), "pump-7", "k"); err == nil {
		t.Fatal("Query answered while the write was in progress and longer than the timeout")
	}
	// It took effect after the driver gave up: only a query can tell.
	testkit.Eventually(t, 10*time.Second, "the late write to land", func() bool { return len(s.Journal()) == 1 })
	q, err := d.Query(t.Context(), "pump-7", "k")
	if err != nil || !q.Applied || string(q.State) != `{"rpm":1200}` {
		t.Fatalf("Query = %+v, %v; want applied", q, err)
	}
}

func TestApplyUnknownByDroppedResponse(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{Device: "pump-7", DropResponseRate: 1})
	d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 2, Queryable: true})
	res := d.Apply(t.Context(), write("k", `{"rpm":1200}`))
	wantResult(t, res, device.Unknown, 1, "connection closed without an answer")
	if got, dropped := s.Requests("pump-7", "k"), s.Injected().Dropped; got != 1 || dropped != 1 {
		t.Fatalf("Requests = %d, dropped = %d; want 1, 1", got, dropped)
	}
	if n := len(s.Journal()); n != 1 {
		t.Fatalf("journal has %d writes, want the dropped one", n)
	}
	q, err := d.Query(t.Context(), "pump-7", "k")
	if err != nil || !q.Applied || string(q.State) != `{"rpm":1200}` {
		t.Fatalf("Query = %+v, %v; want applied", q, err)
	}
}

// TestUnknownBy503ThenTombstone: a 5xx may have applied (for a device that
// does not honour keys it is not retried); the query finds it unapplied and
// tombstones the key, so a late resend of it is refused 409.
func TestUnknownBy503ThenTombstone(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{Device: "pump-7", ErrorRate: 1})
	d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 2, Queryable: true})
	wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1200}`)), device.Unknown, 1, "HTTP 503: injected fault: error_rate 1")
	if got, errs := s.Requests("pump-7", "k"), s.Injected().Errors; got != 1 || errs != 1 {
		t.Fatalf("Requests = %d, errors = %d; want 1, 1", got, errs)
	}
	q, err := d.Query(t.Context(), "pump-7", "k")
	if err != nil || q.Applied {
		t.Fatalf("Query = %+v, %v; want not applied", q, err)
	}
	setFaults(t, s, sim.Faults{})
	wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1200}`)), device.Refused, 1, "tombstoned")
	if j := s.Journal(); len(j) != 0 {
		t.Fatalf("journal = %+v, want none", j)
	}
	// The operation goes again under a new key.
	wantResult(t, d.Apply(t.Context(), write("k.2", `{"rpm":1200}`)), device.Applied, 1, "")
}

func TestIdempotentRetriesReuseTheKey(t *testing.T) {
	t.Run("every try dropped: one write in the journal, unknown", func(t *testing.T) {
		s := sim.StartForTest(t, simDevices)
		setFaults(t, s, sim.Faults{Device: "pump-7", DropResponseRate: 1})
		d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 2, Idempotent: true})
		wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1200}`)), device.Unknown, 3, "connection closed without an answer")
		if got, dropped := s.Requests("pump-7", "k"), s.Injected().Dropped; got != 3 || dropped != 3 {
			t.Fatalf("Requests = %d, dropped = %d; want 3, 3", got, dropped)
		}
		if j := s.Journal(); len(j) != 1 || j[0].Key != "k" {
			t.Fatalf("journal = %+v, want one write", j)
		}
	})
	t.Run("first try dropped, a retry gets the stored answer", func(t *testing.T) {
		s := sim.StartForTest(t, simDevices)
		setFaults(t, s, sim.Faults{Device: "pump-7", DropResponseRate: 1})
		d := newDriver(t, device.HTTPOptions{
			RetryWaitMin: 100 * time.Millisecond,
			Devices:      map[string]device.HTTPDevice{"pump-7": {URL: s.URL(), Retries: 5, Idempotent: true}},
		})
		done := make(chan device.WriteResult)
		go func() { done <- d.Apply(context.Background(), write("k", `{"rpm":1200}`)) }()
		testkit.Eventually(t, 10*time.Second, "a dropped answer", func() bool { return s.Injected().Dropped >= 1 })
		setFaults(t, s, sim.Faults{})
		res := <-done
		if res.Outcome != device.Applied || res.Tries < 2 || string(res.State) != `{"rpm":1200}` {
			t.Fatalf("result = %+v, want applied after a retry", res)
		}
		if got := s.Requests("pump-7", "k"); got != res.Tries {
			t.Fatalf("Requests = %d, tries = %d", got, res.Tries)
		}
		if j := s.Journal(); len(j) != 1 {
			t.Fatalf("journal = %+v, want one write", j)
		}
	})
	t.Run("503s are retried, nothing applied", func(t *testing.T) {
		s := sim.StartForTest(t, simDevices)
		setFaults(t, s, sim.Faults{Device: "pump-7", ErrorRate: 1})
		d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 2, Idempotent: true})
		wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1200}`)), device.Unknown, 3, "HTTP 503")
		if got := s.Requests("pump-7", "k"); got != 3 {
			t.Fatalf("Requests = %d, want 3", got)
		}
	})
	t.Run("a timed-out try is retried and waits for the first", func(t *testing.T) {
		s := sim.StartForTest(t, simDevices)
		setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 250})
		d := driverFor(t, s.URL(), device.HTTPDevice{Timeout: 150 * time.Millisecond, Retries: 5, Idempotent: true})
		done := make(chan device.WriteResult)
		go func() { done <- d.Apply(context.Background(), write("k", `{"rpm":1200}`)) }()
		testkit.Eventually(t, 10*time.Second, "a retry", func() bool { return s.Requests("pump-7", "k") >= 2 })
		setFaults(t, s, sim.Faults{})
		res := <-done
		if res.Outcome != device.Applied || res.Tries < 2 {
			t.Fatalf("result = %+v, want applied after a retry", res)
		}
		if j := s.Journal(); len(j) != 1 {
			t.Fatalf("journal = %+v, want one write", j)
		}
	})
}

// TestUnknownEvenIfALaterTryCannotConnect: once a try may have reached the
// device, the write is unknown, not "not sent", whatever later tries meet.
func TestUnknownEvenIfALaterTryCannotConnect(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{Device: "pump-7", ErrorRate: 1})
	d := newDriver(t, device.HTTPOptions{
		RetryWaitMin: 300 * time.Millisecond,
		Devices:      map[string]device.HTTPDevice{"pump-7": {URL: s.URL(), Retries: 1, Idempotent: true}},
	})
	done := make(chan device.WriteResult)
	go func() { done <- d.Apply(context.Background(), write("k", `{"rpm":1200}`)) }()
	testkit.Eventually(t, 10*time.Second, "the first try", func() bool { return s.Injected().Errors == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	res := <-done
	wantResult(t, res, device.Unknown, 2, "may have reached the device: HTTP 503; last try:")
	if !strings.Contains(res.Reason, "connection refused") {
		t.Fatalf("reason = %q, want the last try's connection refused", res.Reason)
	}
}

func TestHangIsUnknownThenTombstoned(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{Device: "pump-7", Hang: true})
	d := driverFor(t, s.URL(), device.HTTPDevice{Timeout: 100 * time.Millisecond, Queryable: true})
	wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1200}`)), device.Unknown, 1, "no answer within 100ms")
	if s.Injected().Held != 1 {
		t.Fatalf("injected = %+v, want one held", s.Injected())
	}
	q, err := d.Query(t.Context(), "pump-7", "k")
	if err != nil || q.Applied {
		t.Fatalf("Query = %+v, %v; want not applied", q, err)
	}
	setFaults(t, s, sim.Faults{})
	wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":1200}`)), device.Refused, 1, "tombstoned")
}

func TestApplyCancelled(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 3, Idempotent: true})
	t.Run("before sending: not sent", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		res := d.Apply(ctx, write("k1", `{"rpm":1}`))
		if res.Outcome != device.NotSent || s.Requests("pump-7", "k1") != 0 {
			t.Fatalf("result = %+v, requests = %d", res, s.Requests("pump-7", "k1"))
		}
	})
	t.Run("mid-try: unknown", func(t *testing.T) {
		setFaults(t, s, sim.Faults{Device: "pump-7", LatencyMS: 300})
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		wantResult(t, d.Apply(ctx, write("k2", `{"rpm":1}`)), device.Unknown, 1, "may have reached the device")
		testkit.Eventually(t, 10*time.Second, "the write to land", func() bool { return len(s.Journal()) == 1 })
	})
}

func TestQuery(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	d := newDriver(t, device.HTTPOptions{Devices: map[string]device.HTTPDevice{
		"pump-7":  {URL: s.URL(), Queryable: true},
		"valve-1": {URL: s.URL()},
		"pump-9":  {URL: s.URL(), Queryable: true},
		"gone":    {URL: closedPort(t), Queryable: true},
		// A queryable device whose base URL is wrong: every route is the
		// server's plain 404.
		"pump-7x": {URL: s.URL() + "/not-the-firmware", Queryable: true},
	}})
	wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":300}`)), device.Applied, 1, "")

	q, err := d.Query(t.Context(), "pump-7", "k")
	if err != nil || !q.Applied || string(q.State) != `{"rpm":300}` {
		t.Fatalf("Query(applied) = %+v, %v", q, err)
	}
	q, err = d.Query(t.Context(), "pump-7", "never")
	if err != nil || q.Applied || q.State != nil {
		t.Fatalf("Query(never) = %+v, %v", q, err)
	}
	wantResult(t, d.Apply(t.Context(), write("never", `{"rpm":1}`)), device.Refused, 1, "tombstoned")

	if !d.Queryable("pump-7") || d.Queryable("valve-1") || d.Queryable("nope") {
		t.Fatal("Queryable does not follow the configuration")
	}
	for _, tt := range []struct {
		dev  string
		want error
	}{
		{"valve-1", device.ErrNotQueryable},
		{"nope", device.ErrUnknownDevice},
		{"pump-9", device.ErrUnexpectedStatus}, // the firmware's "unknown device" 404 is no tombstone
		// A past defect: a plain 404 was read as a tombstone, so the
		// agent resent under a new key (a possible second apply).
		{"pump-7x", device.ErrUnexpectedStatus},
	} {
		if _, err := d.Query(t.Context(), tt.dev, "k"); !errors.Is(err, tt.want) {
			t.Errorf("Query(%s) = %v, want %v", tt.dev, err, tt.want)
		}
	}
	if _, err := d.Query(t.Context(), "gone", "k"); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Query(gone) = %v, want connection refused", err)
	}
}

func TestMaxResponseBytes(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	d := newDriver(t, device.HTTPOptions{
		MaxResponseBytes: 32,
		Devices:          map[string]device.HTTPDevice{"gen-1": {URL: s.URL()}},
	})
	w := device.Write{Device: "gen-1", OpID: "o", Key: "k", Fence: 1, Action: "paint",
		Params: json.RawMessage(`{"text":"` + strings.Repeat("x", 100) + `"}`)}
	res := d.Apply(t.Context(), w)
	if res.Outcome != device.Applied || res.State != nil || !strings.Contains(res.Reason, "answer larger than 32 bytes") {
		t.Fatalf("result = %+v; want applied without a state", res)
	}
}

func TestConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		dev  string
		cfg  device.HTTPDevice
		want string
	}{
		{"no url", "a", device.HTTPDevice{}, `device a: url "": want http:// or https://`},
		{"bad scheme", "a", device.HTTPDevice{URL: "ftp://x"}, `url "ftp://x"`},
		{"negative timeout", "a", device.HTTPDevice{URL: "http://x", Timeout: -1}, "timeout -1ns: must not be negative"},
		{"too many retries", "a", device.HTTPDevice{URL: "http://x", Retries: 101}, "retries 101: must be 0..100"},
		{"bad id", "a/b", device.HTTPDevice{URL: "http://x"}, `device ID "a/b"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := device.NewHTTP(device.HTTPOptions{Devices: map[string]device.HTTPDevice{tt.dev: tt.cfg}})
			if !errors.Is(err, device.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewHTTP = %v, want ErrInvalidConfig with %q", err, tt.want)
			}
		})
	}
	d := newDriver(t, device.HTTPOptions{})
	if err := d.Add("a", device.HTTPDevice{URL: "http://x"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Add("a", device.HTTPDevice{URL: "http://x"}); !errors.Is(err, device.ErrDuplicateDevice) {
		t.Fatalf("second Add = %v", err)
	}
	res := d.Apply(t.Context(), device.Write{Device: "b", Key: "k", Action: "x"})
	if res.Outcome != device.NotSent || !strings.Contains(res.Reason, device.ErrUnknownDevice.Error()) || res.Tries != 0 {
		t.Fatalf("Apply(unconfigured) = %+v", res)
	}
	res = d.Apply(t.Context(), device.Write{Device: "a", Key: "k", Action: "x", Params: json.RawMessage(`{bad`)})
	if res.Outcome != device.NotSent || res.Tries != 0 {
		t.Fatalf("Apply(bad params) = %+v", res)
	}
}

func TestConcurrentApplies(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{LatencyMS: 5})
	d := newDriver(t, device.HTTPOptions{Logger: slog.New(slog.DiscardHandler), Devices: map[string]device.HTTPDevice{
		"pump-7": {URL: s.URL(), Idempotent: true, Retries: 1},
		"gen-1":  {URL: s.URL()},
	}})
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			w := write(fmt.Sprint("k", i), fmt.Sprintf(`{"rpm":%d}`, i))
			if i%2 == 1 {
				w.Device, w.Action = "gen-1", "x"
			}
			if res := d.Apply(context.Background(), w); res.Outcome != device.Applied {
				t.Errorf("%s/%s: %+v", w.Device, w.Key, res)
			}
		})
	}
	wg.Wait()
	if n := len(s.Journal()); n != 40 {
		t.Fatalf("journal has %d writes, want 40", n)
	}
}

var _ device.Driver = (*device.HTTP)(nil)

// TestNoHiddenResend: net/http resends a request carrying Idempotency-Key
// by itself when a reused connection fails; a device that does not honour
// keys would apply it twice. The driver dials one connection per try, so
// a dropped answer after a warm connection is still one request.
func TestNoHiddenResend(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	d := driverFor(t, s.URL(), device.HTTPDevice{})
	for i := range 3 { // warm: any idle connection would be reused below
		wantResult(t, d.Apply(t.Context(), write(fmt.Sprint("warm", i), `{"rpm":1}`)), device.Applied, 1, "")
	}
	setFaults(t, s, sim.Faults{Device: "pump-7", DropResponseRate: 1})
	wantResult(t, d.Apply(t.Context(), write("k", `{"rpm":2}`)), device.Unknown, 1, "")
	if got := s.Requests("pump-7", "k"); got != 1 {
		t.Fatalf("Requests = %d: the request was resent behind the driver's back", got)
	}
}

// A write whose MayTry says no is not tried again (docs/protocol.md §8: a
// deposed active, woken from a pause between a try and its retry, sends
// no retry after its session is gone; the HA chaos campaign found one
// landing in the firmware's journal after the takeover).
func TestMayTryStopsRetries(t *testing.T) {
	s := sim.StartForTest(t, simDevices)
	setFaults(t, s, sim.Faults{Device: "pump-7", ErrorRate: 1})
	d := driverFor(t, s.URL(), device.HTTPDevice{Retries: 2, Idempotent: true})
	asked := 0
	w := write("k", `{"rpm":1200}`)
	w.MayTry = func() bool { asked++; return false }
	res := d.Apply(t.Context(), w)
	wantResult(t, res, device.Unknown, 1, "no further try")
	if got := s.Requests("pump-7", "k"); got != 1 || asked != 1 {
		t.Fatalf("Requests = %d, MayTry asked %d times; want 1, 1", got, asked)
	}
	// Allowed: every retry is made (the control).
	w = write("k2", `{"rpm":1200}`)
	w.MayTry = func() bool { return true }
	wantResult(t, d.Apply(t.Context(), w), device.Unknown, 3, "HTTP 503")
	if got := s.Requests("pump-7", "k2"); got != 3 {
		t.Fatalf("Requests = %d, want 3", got)
	}
}

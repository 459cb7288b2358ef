package admin

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/edge-agent/edge-agent/internal/agent"
	"github.com/edge-agent/edge-agent/internal/store"
)

// The operator's view (docs/protocol.md §3, added 2026-12-01): the
// gateway's status, a device's history, the writes held unknown, the live
// feed, the charts' figures and the status page.

//go:embed ui
var uiFS embed.FS

// PluginStatus is one policy plugin in GET /v1/status.
type PluginStatus struct {
	Name    string   `json:"name"`
	Devices []string `json:"devices"`
	State   string   `json:"state"` // ok, failing (its last calls failed), error (not loaded)
}

// GatewayStatus is GET /v1/status.
type GatewayStatus struct {
	Gateway       string         `json:"gateway"`
	Version       string         `json:"version"`
	UptimeS       int64          `json:"uptime_s"`
	MQTTConnected bool           `json:"mqtt_connected"`
	StoreOK       bool           `json:"store_ok"`
	Plugins       []PluginStatus `json:"plugins"`
	Ready         bool           `json:"ready"`
	// Extensions: the writes held unknown now, and the open /v1/events
	// streams.
	HeldUnknown  int64 `json:"held_unknown"`
	EventClients int   `json:"event_clients"`
	// Coordination is the fence memory beyond this disk
	// (docs/protocol.md §7).
	Coordination any `json:"coordination"`
	// Role is active, standby or single; ActiveHost is the active's host,
	// on a standby (docs/protocol.md §8).
	Role       string `json:"role"`
	ActiveHost string `json:"active_host,omitempty"`
}

// status builds GET /v1/status.
func status(a *agent.Agent, o Options) GatewayStatus {
	sum := a.Summary()
	st := GatewayStatus{Gateway: sum.Gateway, Version: o.Version, UptimeS: int64(sum.Uptime.Seconds()),
		StoreOK: sum.StoreOK, Plugins: []PluginStatus{}, HeldUnknown: sum.HeldUnknown,
		EventClients: sum.EventClients}
	if st.Version == "" {
		st.Version = "dev"
	}
	if o.MQTTConnected != nil {
		st.MQTTConnected = o.MQTTConnected()
	}
	if o.Plugins != nil {
		st.Plugins = append(st.Plugins, o.Plugins()...)
	}
	st.Ready = o.Ready == nil || o.Ready() == nil
	st.Coordination = map[string]string{"state": "off"}
	if o.Coordination != nil {
		st.Coordination = o.Coordination()
	}
	ro := o.role()
	st.Role, st.ActiveHost = ro.Role, ro.ActiveHost
	return st
}

func operatorRoutes(mux *http.ServeMux, a *agent.Agent, o Options) {
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, status(a, o))
	})
	mux.HandleFunc("GET /v1/devices/{dev}/ops", func(w http.ResponseWriter, r *http.Request) {
		limit := 0
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > store.MaxHistory {
				httpErr(w, fmt.Errorf("%w: limit=%q: want 1 to %d", agent.ErrBadRequest, s, store.MaxHistory))
				return
			}
			limit = n
		}
		page, err := a.History(r.PathValue("dev"), r.URL.Query().Get("before"), limit)
		if err != nil {
			httpErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, page)
	})
	mux.HandleFunc("GET /v1/ops", func(w http.ResponseWriter, r *http.Request) {
		if s := r.URL.Query().Get("status"); s != "unknown" {
			httpErr(w, fmt.Errorf("%w: status=%q: only status=unknown is supported", agent.ErrBadRequest, s))
			return
		}
		ops, err := a.HeldUnknown()
		if err != nil {
			httpErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, agent.OpPage{Ops: ops})
	})
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		secs := 300
		if s := r.URL.Query().Get("seconds"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > agent.StatSeconds {
				httpErr(w, fmt.Errorf("%w: seconds=%q: want 1 to %d", agent.ErrBadRequest, s, agent.StatSeconds))
				return
			}
			secs = n
		}
		writeJSON(w, http.StatusOK, map[string]any{"interval_s": 1, "points": a.Stats(time.Now(), secs)})
	})
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) { serveEvents(w, r, a) })
	ui, _ := fs.Sub(uiFS, "ui")
	page, _ := fs.ReadFile(ui, "index.html")
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
		w.Write(page)
	})
}

// SSE limits: a write to a client that does not read for this long ends its
// stream; a ping keeps idle proxies from closing it.
const (
	eventWriteTimeout = 10 * time.Second
	eventPing         = 15 * time.Second
	// eventBatch: after an event arrives, the stream sleeps this long and
	// then writes everything waiting at once: under load one wake-up and
	// one write per batch, not per event. EventBuffer holds a batch.
	eventBatch = 50 * time.Millisecond
)

// serveEvents streams GET /v1/events until the client goes, falls behind
// (dropped by the hub), stalls a write, or the agent stops.
func serveEvents(w http.ResponseWriter, r *http.Request, a *agent.Agent) {
	// Extension: ?max_rate=N sends at most N events a second (bursts of
	// N), and says how many it skipped (an event "skipped"): a status page
	// under load shows a sample and costs its browser little.
	var lim *rateLimit
	if v := r.URL.Query().Get("max_rate"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100000 {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("max_rate %q: want events per second, 1..100000", v)})
			return
		}
		lim = &rateLimit{rate: float64(n), tokens: float64(n), last: time.Now()}
	}
	s, err := a.Subscribe()
	if err != nil {
		httpErr(w, err)
		return
	}
	defer s.Close()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	skipped := map[string]int{}
	write := func(e agent.Event) {
		if lim != nil && !lim.take(time.Now()) {
			skipped[e.Kind]++
			return
		}
		writeEvent(&buf, e)
	}
	send := func() bool {
		if len(skipped) > 0 {
			b, _ := json.Marshal(skipped)
			writeEvent(&buf, agent.Event{Kind: "skipped", Data: b})
			clear(skipped)
		}
		rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		_, err := w.Write(buf.Bytes())
		buf.Reset()
		return err == nil && rc.Flush() == nil
	}
	buf.WriteString(": edge-agent events\nretry: 2000\n\n")
	if !send() {
		return
	}
	ping := time.NewTicker(eventPing)
	defer ping.Stop()
	batch := time.NewTimer(eventBatch)
	batch.Stop()
	var events <-chan agent.Event = s.Events() // nil while a batch is being gathered
	for {
		select {
		case <-r.Context().Done():
			return
		case <-a.Done():
			return
		case <-s.Gone():
			return // fell behind: the client reconnects and reloads what it shows
		case <-ping.C:
			buf.WriteString(": ping\n\n")
		case e := <-events:
			// The first of a batch: sleep, then take what came meanwhile.
			write(e)
			events = nil
			batch.Reset(eventBatch)
			continue
		case <-batch.C:
			events = s.Events()
			for drained := false; !drained; {
				select {
				case e := <-s.Events():
					write(e)
					if buf.Len() >= 64<<10 && !send() {
						return
					}
				default:
					drained = true
				}
			}
		}
		if (buf.Len() > 0 || len(skipped) > 0) && !send() {
			return
		}
	}
}

// rateLimit is a token bucket: rate tokens a second, at most rate at once.
type rateLimit struct {
	rate, tokens float64
	last         time.Time
}

func (l *rateLimit) take(now time.Time) bool {
	l.tokens = min(l.rate, l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

// writeEvent writes one SSE event; a payload with line breaks (a device's
// state as it sent it) becomes several data lines, which the client joins.
func writeEvent(buf *bytes.Buffer, e agent.Event) {
	buf.WriteString("event: ")
	buf.WriteString(e.Kind)
	buf.WriteByte('\n')
	for _, line := range bytes.Split(bytes.TrimRight(e.Data, "\r\n"), []byte("\n")) {
		buf.WriteString("data: ")
		buf.Write(bytes.TrimRight(line, "\r"))
		buf.WriteByte('\n')
	}
	buf.WriteByte('\n')
}

// backup streams a consistent copy of the store (GET /v1/backup).
func backup(w http.ResponseWriter, r *http.Request, a *agent.Agent) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="agent.db"`)
	a.Backup(r.Context(), w) // logged by the agent; the body is cut short
}

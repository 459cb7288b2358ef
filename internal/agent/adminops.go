package agent

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/wire"
)

// The operator's view (docs/protocol.md §3, added 2026-12-01): the
// gateway's status, a device's history, the writes held unknown, the live
// feed, the charts' figures and the status page. Every read of the store
// is one bbolt read transaction (Store.View): a snapshot that never waits
// for the commit loop, and short (a page) so it never holds bbolt's map.

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
}

// OpEntry is one record in a device's history or in /v1/ops: the recorded
// Result (status and code empty while the command is queued or pending)
// plus the command as received.
type OpEntry struct {
	wire.Result
	Action     string          `json:"action"`
	Params     json.RawMessage `json:"params,omitempty"`
	Holder     string          `json:"holder,omitempty"`
	Lock       string          `json:"lock,omitempty"`
	ReceivedAt time.Time       `json:"received_at"`
	// Extensions: where the record stands (queued, pending, unknown,
	// final), the idempotency key of its last write, and for a held
	// write whether the agent can ask the device (else an operator
	// resolves it).
	Record    store.OpStatus `json:"record"`
	Key       string         `json:"key,omitempty"`
	Queryable *bool          `json:"queryable,omitempty"`
}

// OpPage is a page of GET /v1/devices/{dev}/ops, and GET /v1/ops.
type OpPage struct {
	Ops  []OpEntry `json:"ops"`
	Next string    `json:"next,omitempty"`
}

func (a *Agent) entry(o store.Op, lastFence int64) OpEntry {
	e := OpEntry{Action: o.Action, Params: o.Params, Holder: o.Holder, Lock: o.Lock,
		ReceivedAt: o.ReceivedAt, Record: o.Status, Key: o.Key}
	switch o.Status {
	case store.OpFinal, store.OpUnknown:
		e.Result = resultOf(o, lastFence, false)
	default:
		e.Result = wire.Result{V: wire.Version, OpID: o.OpID, Device: o.Device, Fence: o.Fence, LastFence: lastFence}
	}
	return e
}

// History returns a page of dev's records, newest first: up to limit
// (1..store.MaxHistory; 0 means 50) that arrived before the cursor ("" for
// the newest).
func (a *Agent) History(dev, cursor string, limit int) (OpPage, error) {
	rt := a.devs[dev]
	if rt == nil {
		return OpPage{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	var before uint64
	if cursor != "" {
		var err error
		if before, err = strconv.ParseUint(cursor, 10, 64); err != nil || before == 0 {
			return OpPage{}, fmt.Errorf("%w: before=%q is not a cursor from a previous page", ErrBadRequest, cursor)
		}
	}
	var ops []store.Op
	var more bool
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		ops, more, err = tx.History(dev, before, limit)
		return err
	}); err != nil {
		return OpPage{}, err
	}
	page := OpPage{Ops: make([]OpEntry, 0, len(ops))}
	lf := rt.lastFence.Load()
	for _, o := range ops {
		page.Ops = append(page.Ops, a.entry(o, lf))
	}
	if more && len(ops) > 0 {
		page.Next = strconv.FormatUint(ops[len(ops)-1].InboxSeq, 10)
	}
	return page, nil
}

// HeldUnknown returns every write recorded unknown now, on every device,
// oldest first. Such a write keeps its inbox entry until it is final, so
// the inbox (bounded by the queues) is all there is to read.
func (a *Agent) HeldUnknown() ([]OpEntry, error) {
	out := []OpEntry{}
	err := a.st.View(func(tx *store.Tx) error {
		return tx.Inbox(func(e store.InboxEntry) error {
			o, ok, err := tx.Op(e.Device, e.OpID)
			if err != nil || !ok || o.Status != store.OpUnknown || o.InboxSeq != e.Seq {
				return err
			}
			var lf int64
			q := false
			if rt := a.devs[o.Device]; rt != nil {
				lf, q = rt.lastFence.Load(), rt.drv.Queryable(o.Device)
			}
			en := a.entry(o, lf)
			en.Queryable = &q
			out = append(out, en)
			return nil
		})
	})
	return out, err
}

// Status returns GET /v1/status.
func (a *Agent) Status(o AdminOptions) GatewayStatus {
	st := GatewayStatus{Gateway: a.cfg.GatewayID, Version: o.Version, UptimeS: int64(time.Since(a.begun).Seconds()),
		StoreOK: a.st.Err() == nil && a.Err() == nil, Plugins: []PluginStatus{}, HeldUnknown: a.held.Load(),
		EventClients: int(a.ev.n.Load())}
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
	return st
}

func (a *Agent) operatorRoutes(mux *http.ServeMux, o AdminOptions) {
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.Status(o))
	})
	mux.HandleFunc("GET /v1/devices/{dev}/ops", func(w http.ResponseWriter, r *http.Request) {
		limit := 0
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > store.MaxHistory {
				httpErr(w, fmt.Errorf("%w: limit=%q: want 1 to %d", ErrBadRequest, s, store.MaxHistory))
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
			httpErr(w, fmt.Errorf("%w: status=%q: only status=unknown is supported", ErrBadRequest, s))
			return
		}
		ops, err := a.HeldUnknown()
		if err != nil {
			httpErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, OpPage{Ops: ops})
	})
	mux.HandleFunc("GET /v1/stats", func(w http.ResponseWriter, r *http.Request) {
		secs := 300
		if s := r.URL.Query().Get("seconds"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > statSlots {
				httpErr(w, fmt.Errorf("%w: seconds=%q: want 1 to %d", ErrBadRequest, s, statSlots))
				return
			}
			secs = n
		}
		writeJSON(w, http.StatusOK, map[string]any{"interval_s": 1, "points": a.Stats(time.Now(), secs)})
	})
	mux.HandleFunc("GET /v1/events", a.serveEvents)
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
func (a *Agent) serveEvents(w http.ResponseWriter, r *http.Request) {
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
	s := a.ev.subscribe()
	if s == nil {
		httpErr(w, fmt.Errorf("%w: %d event streams are open already", ErrTooMany, MaxEventClients))
		return
	}
	defer a.ev.unsubscribe(s)
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	skipped := map[string]int{}
	write := func(e event) {
		if lim != nil && !lim.take(time.Now()) {
			skipped[e.kind]++
			return
		}
		writeEvent(&buf, e)
	}
	send := func() bool {
		if len(skipped) > 0 {
			b, _ := json.Marshal(skipped)
			writeEvent(&buf, event{kind: "skipped", data: b})
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
	var events <-chan event = s.ch // nil while a batch is being gathered
	for {
		select {
		case <-r.Context().Done():
			return
		case <-a.ctx.Done():
			return
		case <-s.gone:
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
			events = s.ch
			for drained := false; !drained; {
				select {
				case e := <-s.ch:
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
func writeEvent(buf *bytes.Buffer, e event) {
	buf.WriteString("event: ")
	buf.WriteString(e.kind)
	buf.WriteByte('\n')
	for _, line := range bytes.Split(bytes.TrimRight(e.data, "\r\n"), []byte("\n")) {
		buf.WriteString("data: ")
		buf.Write(bytes.TrimRight(line, "\r"))
		buf.WriteByte('\n')
	}
	buf.WriteByte('\n')
}

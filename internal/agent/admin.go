package agent

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edge-agent/edge-agent/internal/store"
	"github.com/edge-agent/edge-agent/wire"
)

// Device returns the admin view of one device.
func (a *Agent) Device(dev string) (wire.DeviceInfo, error) {
	rt := a.devs[dev]
	if rt == nil {
		return wire.DeviceInfo{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	var d store.Device
	var holder string
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		if d, _, err = tx.Device(dev); err != nil || d.LastOpID == "" {
			return err
		}
		o, _, err := tx.Op(dev, d.LastOpID)
		holder = o.Holder
		return err
	}); err != nil {
		return wire.DeviceInfo{}, err
	}
	// Queue depth is the worker's (a group shares one queue).
	info := wire.DeviceInfo{Device: dev, LastFence: d.LastFence, LastOpID: d.LastOpID,
		QueueDepth: int(rt.w.depth.Load()), Pending: int(rt.pending.Load()),
		Holder: holder, Group: rt.cfg.Group, QueueLimit: int(rt.w.limit), Queryable: rt.drv.Queryable(dev)}
	if !d.UpdatedAt.IsZero() {
		info.UpdatedAt = &d.UpdatedAt
	}
	return info, nil
}

// OpResult returns the recorded outcome of (dev, op) as a Result.
func (a *Agent) OpResult(dev, op string) (wire.Result, error) {
	rt := a.devs[dev]
	if rt == nil {
		return wire.Result{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	var o store.Op
	var ok bool
	if err := a.st.View(func(tx *store.Tx) error {
		var err error
		o, ok, err = tx.Op(dev, op)
		return err
	}); err != nil {
		return wire.Result{}, err
	}
	if !ok || (o.Status != store.OpFinal && o.Status != store.OpUnknown) {
		return wire.Result{}, fmt.Errorf("%w: %s/%s", ErrNoSuchOp, dev, op)
	}
	return resultOf(o, rt.lastFence.Load(), false), nil
}

// Resolve records an operator's answer for an unknown write on a device that
// cannot be asked (queryable: false): applied ends it applied/ok; not
// applied ends it failed/not_applied, never resent (invariant 6).
//
// An applied write changed the device, so the state the agent knows (and
// policies see) changes too: state, when the operator gives it, is the
// device's state now; otherwise the parameters that were sent are merged
// into the last known state, key by key (what a "set" does on the
// simulated device types). Policies never see the pre-write state of a
// write an operator confirmed.
func (a *Agent) Resolve(ctx context.Context, dev, op string, applied bool, state json.RawMessage) (wire.Result, error) {
	rt := a.devs[dev]
	if rt == nil {
		return wire.Result{}, fmt.Errorf("%w: %s", ErrUnknownDevice, dev)
	}
	if rt.drv.Queryable(dev) && rt.heldOp() != op {
		// A device that can be asked is resolved by the agent, except a
		// write a read-back could not decide: that one is held for an
		// operator (worker.holdReadBack).
		return wire.Result{}, fmt.Errorf("%w: %s", ErrQueryable, dev)
	}
	if err := a.settled(rt); err != nil {
		return wire.Result{}, err
	}
	dec := Operator(applied)
	if !applied {
		state = nil
	}
	var res wire.Result
	var d store.Device
	var o store.Op
	var moved, missing, notUnknown bool
	err := a.st.Update(ctx, func(tx *store.Tx) error {
		var ok bool
		var err error
		o, ok, err = tx.Op(dev, op)
		if err != nil {
			return err
		}
		if !ok {
			missing = true
			return nil
		}
		if o.Status != store.OpUnknown {
			notUnknown = true
			return nil
		}
		if d, moved, err = a.endTx(tx, &o, dec, state); err != nil {
			return err
		}
		res = resultOf(o, d.LastFence, false)
		return nil
	})
	switch {
	case err != nil:
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			a.fail(err)
		}
		return wire.Result{}, err
	case missing:
		return wire.Result{}, fmt.Errorf("%w: %s/%s", ErrNoSuchOp, dev, op)
	case notUnknown:
		return wire.Result{}, fmt.Errorf("%w: %s/%s", ErrNotUnknown, dev, op)
	}
	a.ended(rt, &o, dec, d, moved)
	select {
	case rt.w.resolve <- struct{}{}:
	default:
	}
	return res, nil
}

// mergeState merges the top-level keys of params into state (both JSON
// objects; anything unreadable yields params alone).
func mergeState(state, params json.RawMessage) json.RawMessage {
	m := map[string]json.RawMessage{}
	if len(state) > 0 && json.Unmarshal(state, &m) != nil {
		m = map[string]json.RawMessage{}
	}
	var p map[string]json.RawMessage
	if len(params) > 0 && json.Unmarshal(params, &p) == nil {
		for k, v := range p {
			m[k] = v
		}
	}
	return mustJSON(m)
}

// AdminOptions configure the admin HTTP API.
type AdminOptions struct {
	Token    string              // required as a Bearer token on POST when set
	Ready    func() error        // nil error: ready
	Gatherer prometheus.Gatherer // for /metrics; nil: the default
	// OffLoopback: admin.listen is not a loopback address, so every
	// endpoint but /healthz, /readyz and /metrics needs the token
	// (admin_access.go). False: GETs are open.
	OffLoopback bool
	// Version is reported by GET /v1/status; "" means "dev".
	Version string
	// MQTTConnected reports the broker session (GET /v1/status); nil
	// means false.
	MQTTConnected func() bool
	// Plugins lists the policy plugins (GET /v1/status); nil means none.
	Plugins func() []PluginStatus
}

// AdminHandler serves docs/protocol.md §3.
func (a *Agent) AdminHandler(o AdminOptions) http.Handler {
	mux := http.NewServeMux()
	g := o.Gatherer
	if g == nil {
		g = prometheus.DefaultGatherer
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if o.Ready != nil {
			if err := o.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/devices", func(w http.ResponseWriter, r *http.Request) {
		out := []wire.DeviceInfo{}
		for _, id := range a.DeviceIDs() {
			d, err := a.Device(id)
			if err != nil {
				httpErr(w, err)
				return
			}
			out = append(out, d)
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /v1/devices/{dev}", func(w http.ResponseWriter, r *http.Request) {
		d, err := a.Device(r.PathValue("dev"))
		if err != nil {
			httpErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
	})
	mux.HandleFunc("GET /v1/devices/{dev}/ops/{op}", func(w http.ResponseWriter, r *http.Request) {
		res, err := a.OpResult(r.PathValue("dev"), r.PathValue("op"))
		if err != nil {
			httpErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("POST /v1/devices/{dev}/ops/{op}/resolve", func(w http.ResponseWriter, r *http.Request) {
		if o.Token != "" {
			if !bearerOK(r, o.Token) {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Authorization: Bearer <admin.token> required"})
				return
			}
		}
		var body struct {
			Applied *bool           `json:"applied"`
			State   json.RawMessage `json:"state"`
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || body.Applied == nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `body must be {"applied": true|false} (optionally "state": {...} with applied: true)`})
			return
		}
		if len(body.State) > 0 && (!*body.Applied || body.State[0] != '{') {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `"state" must be a JSON object, and only with "applied": true`})
			return
		}
		res, err := a.Resolve(r.Context(), r.PathValue("dev"), r.PathValue("op"), *body.Applied, body.State)
		if err != nil {
			httpErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	a.operatorRoutes(mux, o)
	if o.OffLoopback {
		return tokenGate(mux, o.Token)
	}
	return mux
}

// bearerOK reports whether r carries "Authorization: Bearer <token>". The
// scheme is case-insensitive (RFC 6750 / RFC 9110: "bearer" and "BEARER"
// are the same), and required: a bare token is refused.
func bearerOK(r *http.Request, token string) bool {
	scheme, got, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func httpErr(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrUnknownDevice), errors.Is(err, ErrNoSuchOp):
		code = http.StatusNotFound
	case errors.Is(err, ErrQueryable), errors.Is(err, ErrNotUnknown), errors.Is(err, ErrTooEarly):
		code = http.StatusConflict
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, ErrTooMany):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

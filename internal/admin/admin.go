// Package admin is edge-agent's operator surface: the admin HTTP API
// (docs/protocol.md §3), the live event stream and the status page, over
// the agent's query methods.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/agent"
)

// Options configure the admin HTTP API.
type Options struct {
	Token    string              // required as a Bearer token on POST when set
	Ready    func() error        // nil error: ready
	Gatherer prometheus.Gatherer // for /metrics; nil: the default
	// OffLoopback: admin.listen is not a loopback address, so every
	// endpoint but /healthz, /readyz and /metrics needs the token
	// (access.go). False: GETs are open.
	OffLoopback bool
	// Version is reported by GET /v1/status; "" means "dev".
	Version string
	// MQTTConnected reports the broker session (GET /v1/status); nil
	// means false.
	MQTTConnected func() bool
	// Plugins lists the policy plugins (GET /v1/status); nil means none.
	Plugins func() []PluginStatus
	// Coordination is GET /v1/status's "coordination" (docs/protocol.md
	// §7); nil means {"state": "off"}.
	Coordination func() any
	// Role is GET /v1/status's "role" and, on a standby, the active's
	// host (docs/protocol.md §8); nil means single.
	Role func() Role
}

// The roles of GET /v1/status (docs/protocol.md §8).
const (
	RoleActive  = "active"
	RoleStandby = "standby"
	RoleSingle  = "single" // without ha
)

// Role is an agent's role; ActiveHost is set on a standby.
type Role struct {
	Role       string
	ActiveHost string
}

func (o Options) role() Role {
	if o.Role == nil {
		return Role{Role: RoleSingle}
	}
	return o.Role()
}

// Standby serves the admin API of a standby (docs/protocol.md §8):
// /healthz, /readyz (503, saying which host is active), /metrics and
// GET /v1/status with its role; everything else is 503. The access rules
// of Handler hold.
func Standby(o Options) http.Handler {
	mux := http.NewServeMux()
	g := o.Gatherer
	if g == nil {
		g = prometheus.DefaultGatherer
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not ready: standby (active: "+o.role().ActiveHost+")", http.StatusServiceUnavailable)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		st := GatewayStatus{Version: o.Version, Plugins: []PluginStatus{}, Coordination: map[string]string{"state": "off"}}
		if st.Version == "" {
			st.Version = "dev"
		}
		if o.Coordination != nil {
			st.Coordination = o.Coordination()
		}
		ro := o.role()
		st.Role, st.ActiveHost = ro.Role, ro.ActiveHost
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "standby: the active agent is on "+o.role().ActiveHost, http.StatusServiceUnavailable)
	})
	if o.OffLoopback {
		return tokenGate(mux, o.Token)
	}
	return mux
}

// Handler serves docs/protocol.md §3 for a.
func Handler(a *agent.Agent, o Options) http.Handler {
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
	mux.HandleFunc("GET /v1/backup", func(w http.ResponseWriter, r *http.Request) {
		if o.Token != "" && !bearerOK(r, o.Token) {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Authorization: Bearer <admin.token> required"})
			return
		}
		backup(w, r, a)
	})
	operatorRoutes(mux, a, o)
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
	case errors.Is(err, agent.ErrUnknownDevice), errors.Is(err, agent.ErrNoSuchOp):
		code = http.StatusNotFound
	case errors.Is(err, agent.ErrQueryable), errors.Is(err, agent.ErrNotUnknown), errors.Is(err, agent.ErrTooEarly):
		code = http.StatusConflict
	case errors.Is(err, agent.ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, agent.ErrTooMany):
		code = http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

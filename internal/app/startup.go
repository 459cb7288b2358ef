package app

import (
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/edge-agent/edge-agent/internal/policy"
)

// Start-up: the admin API listens first, so /healthz answers at
// once and /readyz says what the agent waits for while the store opens and
// the policy plugins compile (seconds with a cold compilation cache).
// Nothing that decides commands runs before the plugins are loaded: the
// agent's workers start, and the MQTT session subscribes, only after
// policy.Host.Start has succeeded. So a command that arrives meanwhile
// waits, in the broker's persistent session or in the inbox from the
// previous run, and is decided by its loaded plugin (invariant 5: never by
// a plugin that is not there); a plugin that cannot load stops the agent
// (exit 2), and the commands wait for the next start.

// startup is what Start is doing, for Ready while it runs.
type startup struct {
	// step is set from New until Start has finished; nil once it has.
	// Start stores nil after it has set every field Ready and the admin
	// API read afterwards (the atomic orders them).
	step atomic.Pointer[string]
	// host is the policy host while its plugins load.
	host atomic.Pointer[policy.Host]
}

func (s *startup) set(step string) { s.step.Store(&step) }

// done is true once Start has finished.
func (s *startup) done() bool { return s.step.Load() == nil }

// err says what Start is waiting for; nil once it has finished.
func (s *startup) err() error {
	step := s.step.Load()
	if step == nil {
		return nil
	}
	if h := s.host.Load(); h != nil {
		switch p := h.Progress(); {
		case p.Ready, p.Total == 0: // done, or not counted yet
		case p.Compiled < p.Total:
			return fmt.Errorf("compiling plugins %d/%d", p.Compiled, p.Total)
		default:
			return errors.New("initialising plugins")
		}
	}
	return errors.New(*step)
}

// handlerSwitch is the admin API's handler: the start-up one until the
// agent's is ready.
type handlerSwitch struct{ h atomic.Pointer[http.Handler] }

func (s *handlerSwitch) set(h http.Handler) { s.h.Store(&h) }

func (s *handlerSwitch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*s.h.Load()).ServeHTTP(w, r)
}

// startingHandler serves the admin API while Start runs: /healthz and
// /readyz (503 saying what Start waits for); everything else, /metrics
// included, is 503 until the agent is up. It reveals nothing, so the
// access rules of docs/protocol.md §3 hold; and no scrape can run the
// agent's metric functions while Start is still building what they read.
func (a *App) startingHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := a.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		msg := "starting"
		if err := a.boot.err(); err != nil {
			msg += ": " + err.Error()
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, msg, http.StatusServiceUnavailable)
	})
	return mux
}

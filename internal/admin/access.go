package admin

import "net/http"

// The admin API's access rules (docs/protocol.md §3, added 2026-12-01). On a
// loopback admin.listen, GETs are open and POSTs need the token when one
// is set (Handler). On any other address the token is required (the
// configuration refuses to start without it), and every endpoint except
// the probes and the metrics needs it: tokenGate.

// openOffLoopback are the endpoints that stay open on any address: what
// a load balancer, a supervisor or Prometheus asks without a secret.
var openOffLoopback = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// tokenGate requires "Authorization: Bearer <token>" on every request but
// GET/HEAD of openOffLoopback. An empty token refuses them all (the
// configuration never allows it off loopback; this is the fail-closed
// answer if it did).
func tokenGate(h http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		open := openOffLoopback[r.URL.Path] && (r.Method == http.MethodGet || r.Method == http.MethodHead)
		if !open && (token == "" || !bearerOK(r, token)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="edge-agent"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Authorization: Bearer <admin.token> required (admin.listen is not a loopback address)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

package admin

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// Off loopback, every endpoint but the probes and the metrics needs the
// token (docs/protocol.md §3).
func TestTokenGateOffLoopback(t *testing.T) {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	for _, token := range []string{"s3cret", ""} {
		h := tokenGate(inner, token)
		for _, tt := range []struct {
			method, path, auth string
			want               int
		}{
			{"GET", "/healthz", "", http.StatusTeapot},
			{"GET", "/readyz", "", http.StatusTeapot},
			{"GET", "/metrics", "", http.StatusTeapot},
			{"HEAD", "/healthz", "", http.StatusTeapot},
			{"POST", "/healthz", "", http.StatusUnauthorized},
			{"GET", "/v1/devices", "", http.StatusUnauthorized},
			{"GET", "/v1/devices/pump-7/ops/x", "Bearer wrong", http.StatusUnauthorized},
			{"GET", "/", "", http.StatusUnauthorized},
			{"POST", "/v1/devices/d/ops/o/resolve", "", http.StatusUnauthorized},
			{"GET", "/v1/devices", "Bearer s3cret", http.StatusTeapot},
			{"POST", "/v1/devices/d/ops/o/resolve", "bearer s3cret", http.StatusTeapot},
		} {
			want := tt.want
			if token == "" && want == http.StatusTeapot && !openOffLoopback[tt.path] {
				want = http.StatusUnauthorized // no token: nothing but the open endpoints
			}
			r := httptest.NewRequest(tt.method, tt.path, nil)
			if tt.auth != "" {
				r.Header.Set("Authorization", tt.auth)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != want {
				t.Errorf("token %q: %s %s (%q): %d, want %d", token, tt.method, tt.path, tt.auth, w.Code, want)
			}
		}
	}
}

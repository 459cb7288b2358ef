package admin

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The admin API answers only requests that name it in Host (so a page
// whose host name rebinds to it is refused), changes only on requests
// without an Origin or from its own, with a JSON body (so a page cannot
// send a "simple" cross-origin POST), and never lets itself be framed.
func TestAdminGuard(t *testing.T) {
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	type req struct {
		method, path, host, origin, ctype string
		want                              int
	}
	const json = "application/json"
	for _, tt := range []struct {
		listen string
		names  []string
		reqs   []req
	}{
		{"127.0.0.1:9464", nil, []req{
			{"GET", "/v1/ops", "127.0.0.1:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "localhost:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "LOCALHOST.", "", "", http.StatusTeapot},
			{"GET", "/", "evil.test:9464", "", "", http.StatusMisdirectedRequest},
			{"GET", "/v1/ops", "evil.test:9464", "", "", http.StatusMisdirectedRequest},
			{"GET", "/v1/events", "127.0.0.2:9464", "", "", http.StatusMisdirectedRequest},
			{"GET", "/v1/ops", "", "", "", http.StatusMisdirectedRequest},
			{"GET", "/healthz", "evil.test:9464", "", "", http.StatusTeapot},
			{"GET", "/metrics", "prometheus-sees-me-as:9464", "", "", http.StatusTeapot},
			{"POST", "/healthz", "evil.test:9464", "", json, http.StatusMisdirectedRequest},
			{"POST", "/v1/devices/d/ops/o/resolve", "evil.test:9464", "http://evil.test:9464", json, http.StatusMisdirectedRequest},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "", json, http.StatusTeapot},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "", "application/json; charset=utf-8", http.StatusTeapot},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "http://127.0.0.1:9464", json, http.StatusTeapot},
			{"POST", "/v1/devices/d/ops/o/resolve", "localhost:9464", "http://localhost:9464", json, http.StatusTeapot},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "http://localhost:8000", json, http.StatusForbidden},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "http://127.0.0.1:8000", json, http.StatusForbidden},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "null", json, http.StatusForbidden},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "", "", http.StatusUnsupportedMediaType},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "", "text/plain;charset=UTF-8", http.StatusUnsupportedMediaType},
			{"POST", "/v1/devices/d/ops/o/resolve", "127.0.0.1:9464", "", "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
			{"DELETE", "/v1/devices/d", "127.0.0.1:9464", "http://evil.test", json, http.StatusForbidden},
		}},
		{"0.0.0.0:9464", []string{"gw-1.plant.example"}, []req{
			{"GET", "/v1/ops", "10.1.2.3:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "[fd00::1]:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "GW-1.plant.example:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "localhost:9464", "", "", http.StatusMisdirectedRequest},
			{"GET", "/v1/ops", "evil.test:9464", "", "", http.StatusMisdirectedRequest},
			{"POST", "/v1/devices/d/ops/o/resolve", "gw-1.plant.example:9464", "http://gw-1.plant.example:9464", json, http.StatusTeapot},
		}},
		{"[::1]:0", nil, []req{
			{"GET", "/v1/ops", "[::1]:41000", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "localhost:41000", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "127.0.0.1:41000", "", "", http.StatusMisdirectedRequest},
		}},
		{"localhost:9464", nil, []req{
			{"GET", "/v1/ops", "localhost:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "127.0.0.1:9464", "", "", http.StatusTeapot},
			{"GET", "/v1/ops", "evil.test:9464", "", "", http.StatusMisdirectedRequest},
		}},
	} {
		h := Guard(inner, tt.listen, tt.names)
		for _, q := range tt.reqs {
			r := httptest.NewRequest(q.method, q.path, strings.NewReader(`{"applied":true}`))
			r.Host = q.host
			if q.origin != "" {
				r.Header.Set("Origin", q.origin)
			}
			if q.ctype != "" {
				r.Header.Set("Content-Type", q.ctype)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != q.want {
				t.Errorf("listen %s: %s %s Host %q Origin %q Content-Type %q: %d, want %d (%s)",
					tt.listen, q.method, q.path, q.host, q.origin, q.ctype, w.Code, q.want, strings.TrimSpace(w.Body.String()))
			}
			if w.Header().Get("X-Frame-Options") != "DENY" || w.Header().Get("Content-Security-Policy") != "frame-ancestors 'none'" {
				t.Errorf("%s %s: framing not forbidden: %v", q.method, q.path, w.Header())
			}
		}
	}
}

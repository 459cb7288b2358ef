package admin

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A standby's admin API (docs/protocol.md §8): /readyz 503 naming the
// active's host, GET /v1/status with the role, everything else 503; off
// loopback the token is required as on an active.
func TestStandbyHandler(t *testing.T) {
	o := Options{Version: "1.2.3", Role: func() Role { return Role{Role: RoleStandby, ActiveHost: "box-a"} },
		Coordination: func() any { return map[string]string{"state": "connected"} }}
	h := Standby(o)
	get := func(h http.Handler, path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	if w := get(h, "/readyz", ""); w.Code != 503 || !strings.Contains(w.Body.String(), "standby (active: box-a)") {
		t.Fatalf("/readyz: %d %s", w.Code, w.Body)
	}
	w := get(h, "/v1/status", "")
	var st GatewayStatus
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &st) != nil || st.Role != "standby" || st.ActiveHost != "box-a" || st.Version != "1.2.3" {
		t.Fatalf("/v1/status: %d %s", w.Code, w.Body)
	}
	if w := get(h, "/v1/devices", ""); w.Code != 503 {
		t.Fatalf("/v1/devices on a standby: %d", w.Code)
	}
	o.OffLoopback, o.Token = true, "s3cret"
	h = Standby(o)
	if w := get(h, "/v1/status", ""); w.Code != 401 {
		t.Fatalf("/v1/status off loopback without the token: %d", w.Code)
	}
	if w := get(h, "/v1/status", "s3cret"); w.Code != 200 {
		t.Fatalf("/v1/status off loopback with the token: %d", w.Code)
	}
	if r := (Options{}).role(); r.Role != RoleSingle {
		t.Fatalf("without ha: %+v", r)
	}
}

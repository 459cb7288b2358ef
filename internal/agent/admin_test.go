package agent

import (
	"net/http/httptest"
	"testing"
)

// A past defect: the admin token check accepted a bare token without "Bearer "
// and refused a lowercase scheme (RFC 6750: the scheme is
// case-insensitive).
func TestBearer(t *testing.T) {
	for _, tt := range []struct {
		header string
		ok     bool
	}{
		{"Bearer s3cret", true},
		{"bearer s3cret", true},
		{"BEARER s3cret", true},
		{"Bearer  s3cret ", true},
		{"s3cret", false},
		{"Bearer", false},
		{"Bearer wrong", false},
		{"Basic s3cret", false},
		{"Bearers3cret", false},
		{"", false},
	} {
		r := httptest.NewRequest("POST", "/v1/devices/d/ops/o/resolve", nil)
		if tt.header != "" {
			r.Header.Set("Authorization", tt.header)
		}
		if got := bearerOK(r, "s3cret"); got != tt.ok {
			t.Errorf("Authorization %q: %v, want %v", tt.header, got, tt.ok)
		}
	}
}

package admin

import (
	"mime"
	"net"
	"net/http"
	"strings"

	"github.com/edge-agent/edge-agent/internal/clip"
)

// Guard keeps web pages of other origins away from the admin API
// (docs/protocol.md §3, "Browsers"). A loopback admin API without a token
// is open to any process of the host, and so to any page a browser on the
// host shows: without these checks, a page can send a resolve as a "simple"
// request (no CORS preflight) or, through a host name that rebinds to
// 127.0.0.1, read the API as its own origin.
//
//   - Host: every request but GET/HEAD of the probes and /metrics (which a
//     supervisor or Prometheus may reach by any name, and which are open
//     off loopback too) must name the admin API's own host: the host of
//     listen (any IP address when listen has none or is 0.0.0.0/::),
//     "localhost" on a loopback listen, or one of names
//     (admin.allowed_hosts). A page whose name rebinds to this host gets
//     421.
//   - Every request but GET, HEAD and OPTIONS must come without an Origin
//     (curl, edgectl) or from the API's own origin (http://<Host>), and
//     carry Content-Type: application/json (which a page can send to
//     another origin only after a preflight this API never answers):
//     otherwise 403, or 415 for the Content-Type.
//   - Every response forbids framing (X-Frame-Options: DENY,
//     Content-Security-Policy: frame-ancestors 'none'), so the status page
//     cannot be clickjacked.
func Guard(h http.Handler, listen string, names []string) http.Handler {
	g := newHostRule(listen, names)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Content-Security-Policy", "frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		read := r.Method == http.MethodGet || r.Method == http.MethodHead
		if !(read && openOffLoopback[r.URL.Path]) && !g.allows(r.Host) {
			writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": "Host " + clip.String(r.Host, 80) +
				" is not this admin API's (admin.listen, or a name in admin.allowed_hosts)"})
			return
		}
		if read || r.Method == http.MethodOptions {
			h.ServeHTTP(w, r)
			return
		}
		if o := r.Header.Get("Origin"); o != "" && !strings.EqualFold(o, origin(r)) {
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "Origin " + clip.String(o, 80) + " may not change this admin API (only its own pages, or a client without Origin)"})
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeJSON(w, http.StatusUnsupportedMediaType, map[string]string{"error": "Content-Type: application/json required"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// origin is the origin of the API as r reached it.
func origin(r *http.Request) string {
	if r.TLS != nil {
		return "https://" + r.Host
	}
	return "http://" + r.Host
}

// hostRule says which Host headers name the admin API.
type hostRule struct {
	names  map[string]bool // host names and IP literals, lowercase
	anyIP  bool            // listen on every address: any IP literal
	listen net.IP          // the listen address's IP, if it is one
}

func newHostRule(listen string, names []string) hostRule {
	g := hostRule{names: map[string]bool{}}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	host = normHost(host)
	switch ip := net.ParseIP(host); {
	case host == "" || ip != nil && ip.IsUnspecified():
		g.anyIP = true
	case ip != nil:
		g.listen = ip
		if ip.IsLoopback() {
			g.names["localhost"] = true
		}
	default:
		g.names[host] = true
		if host == "localhost" {
			g.listen = net.IPv4(127, 0, 0, 1)
		}
	}
	for _, n := range names {
		g.names[normHost(n)] = true
	}
	return g
}

// normHost is a host name as compared: lowercase, without a trailing dot
// or IPv6 brackets.
func normHost(h string) string {
	return strings.TrimSuffix(strings.Trim(strings.ToLower(h), "[]"), ".")
}

func (g hostRule) allows(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport // no port
	}
	host = normHost(host)
	if host == "" {
		return false
	}
	if g.names[host] {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (g.anyIP || g.listen != nil && g.listen.Equal(ip))
}

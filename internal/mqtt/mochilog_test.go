package mqtt

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	mochi "github.com/mochi-mqtt/server/v2"
)

// mochi's records reach the agent's log in its words: a connection that
// ended because it was closed (the broker's own Close on a clean stop) is
// a Debug record, not a warning, and mochi's records without a message
// get one; other warnings pass as they are.
func TestMochiLogInTheAgentsWords(t *testing.T) {
	closed := &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	for _, tc := range []struct {
		name  string
		level slog.Level // the agent's --log-level
		log   func(*slog.Logger)
		want  string // "" for nothing logged
	}{
		{"closed connection at info", slog.LevelInfo, func(l *slog.Logger) { l.Warn("", "error", closed) }, ""},
		{"closed connection at debug", slog.LevelDebug, func(l *slog.Logger) { l.Warn("", "error", closed) },
			`level=DEBUG msg="mqtt: embedded broker: a connection ended" error="read tcp: use of closed network connection"`},
		{"packet of a closed connection", slog.LevelInfo, func(l *slog.Logger) {
			l.Warn("error processing packet", "error", mochi.ErrConnectionClosed, "client", "c")
		}, ""},
		{"another error", slog.LevelInfo, func(l *slog.Logger) { l.Warn("", "error", errors.New("tls: bad certificate")) },
			`level=WARN msg="mqtt: embedded broker: a connection ended" error="tls: bad certificate"`},
		{"a warning", slog.LevelInfo, func(l *slog.Logger) { l.Warn("client store quota reached", "client", "c") },
			`level=WARN msg="client store quota reached" client=c`},
		{"info", slog.LevelInfo, func(l *slog.Logger) { l.Info("added hook") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			h := slog.NewTextHandler(&b, &slog.HandlerOptions{Level: tc.level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}})
			tc.log(slog.New(minLevel{h, slog.LevelWarn}))
			if got := strings.TrimSpace(b.String()); got != tc.want {
				t.Fatalf("logged %q, want %q", got, tc.want)
			}
		})
	}
}

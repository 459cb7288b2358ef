package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// A mosquitto already on the embedded broker's address (Debian's starts on
// 127.0.0.1:1883 when installed): the agent does not start, and says who
// holds the address and which line uses that broker instead.
func TestEmbeddedListenTakenByMosquitto(t *testing.T) {
	m := mqtttest.StartMosquitto(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`gateway_id: gw-1
data_dir: %s
mqtt: {broker: embedded, embedded_listen: %q}
devices:
  - id: pump-7
    type: pump
    driver: {url: "http://127.0.0.1:1"}
`, t.TempDir(), m.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = New(cfg, Options{Logger: slog.New(slog.DiscardHandler)}).Start(ctx)
	if err == nil {
		t.Fatal("started with mosquitto on its embedded_listen")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("the error does not wrap EADDRINUSE: %v", err)
	}
	for _, want := range []string{
		"mqtt.embedded_listen " + m.Addr() + " is taken by mosquitto (pid ",
		"set mqtt.broker: tcp://" + m.Addr() + " without embedded_listen",
		"or move embedded_listen to a free port: listen tcp " + m.Addr() + ": bind: address already in use",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
}

// Where /proc does not show the holder (another user's process, or the
// unit's ProtectProc=invisible), the message still names the address and
// the fix; an error that is not EADDRINUSE is not explained.
func TestAddrInUseWithoutAProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = net.Listen("tcp", ln.Addr().String())
	if err == nil {
		t.Fatal("bound an address in use")
	}
	// This process holds it: listenerProcess skips itself.
	got := addrInUse(err, ln.Addr().String()).Error()
	if !strings.Contains(got, "is taken by another process (`ss -ltnp` names it)") ||
		!strings.Contains(got, "mqtt.broker: tcp://"+ln.Addr().String()) {
		t.Errorf("got %q", got)
	}
	other := fmt.Errorf("some: %w", syscall.EACCES)
	if addrInUse(other, "127.0.0.1:1883") != nil {
		t.Error("an error that is not EADDRINUSE was explained as one")
	}
}

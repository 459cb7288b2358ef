package etcdtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Mosquitto is the MQTT broker binary StartMosquitto runs.
var Mosquitto = "/usr/sbin/mosquitto"

// StartMosquitto runs a real mosquitto on a free loopback port (no
// persistence, no queue limit) and returns its URL (tcp://127.0.0.1:N). It
// is stopped in t.Cleanup; the test is skipped when mosquitto is missing.
// It lives here so the controller's and edgectl's tests share it.
func StartMosquitto(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat(Mosquitto); err != nil {
		t.Skipf("etcdtest: %s not installed: %v", Mosquitto, err)
	}
	for try := 0; try < 3; try++ {
		addr := FreeAddr(t)
		_, port, _ := net.SplitHostPort(addr)
		dir := t.TempDir()
		conf := filepath.Join(dir, "mosquitto.conf")
		body := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 0\n", port)
		if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		logf, err := os.Create(filepath.Join(dir, "mosquitto.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(Mosquitto, "-c", conf)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("etcdtest: start mosquitto: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
		deadline := time.Now().Add(5 * time.Second)
	wait:
		for time.Now().Before(deadline) {
			select {
			case <-done:
				break wait // port taken meanwhile: try another
			default:
			}
			if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
				c.Close()
				return "tcp://" + addr
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Fatal("etcdtest: mosquitto did not start")
	return ""
}

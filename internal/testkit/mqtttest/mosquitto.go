// Package mqtttest starts real MQTT brokers for tests and talks to them:
//
//   - StartMosquitto: mosquitto running the project's configs/mosquitto.conf
//     on a free loopback port, data in t.TempDir(); Stop, Kill, Restart
//     (same port, same data) and Wipe to test reconnects and persistence.
//   - StartEmbedded: the agent's embedded broker (mqtt.Embedded), with the
//     same Stop, Restart and Wipe; both satisfy Broker, so a test can run
//     against each.
//   - StartNATS: a 3-node NATS cluster (rig.StartNATS: JetStream, routes
//     and the MQTT listener on each node) with Kill and Restart of a node
//     (same ports, same store), the broker cluster of docs/protocol.md §9.
//   - Subscribe / Await / AwaitPayload: a throwaway subscriber whose
//     messages a test waits for with a deadline.
//   - Publish: a one-shot QoS 1 publish.
//
// The TCP proxy, free ports and the process starter it uses are testkit's.
//
// It is an ordinary package so that every package's tests can use it; it
// imports testing and must not be linked into a program.
package mqtttest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// SyncBuffer is testkit's (kept here for the tests that named it so).
type SyncBuffer = testkit.SyncBuffer

// MosquittoBinary is where StartMosquitto looks for mosquitto first; then
// it searches PATH.
const MosquittoBinary = "/usr/sbin/mosquitto"

// Broker is what StartMosquitto and StartEmbedded return, so that a test
// can run against both.
type Broker interface {
	// URL is the broker's tcp://127.0.0.1:port.
	URL() string
	// Stop shuts the broker down cleanly (it saves its state) and waits.
	Stop()
	// Restart starts it again on the same port with the same data; it
	// stops it first if it is running.
	Restart()
	// Wipe deletes the broker's persisted data (sessions, subscriptions,
	// queued and retained messages); only while it is stopped.
	Wipe()
}

// Mosquitto is a mosquitto process running the shipped config.
type Mosquitto struct {
	t     testing.TB
	bin   string
	dir   string // holds mosquitto.conf; data/ is the persistence location
	port  int
	extra []string // lines added to the configuration

	mu   sync.Mutex
	proc *testkit.Proc // nil while stopped
	log  *testkit.SyncBuffer
}

// StartMosquitto runs mosquitto with configs/mosquitto.conf (the listener
// moved to a free loopback port, persistence_location to a temporary
// directory, logging to a buffer that is printed if the test fails) and
// returns once it accepts connections. It is killed in t.Cleanup.
//
// Without a mosquitto binary the test is skipped, except under CI (CI set
// in the environment), where it fails: CI must install mosquitto
// (apt-get install mosquitto).
//
// extra lines are appended to the configuration, after the listener (so
// listener options such as certfile apply to it): e.g. TLS, password_file,
// acl_file and "allow_anonymous false" for a closed broker.
func StartMosquitto(t testing.TB, extra ...string) *Mosquitto {
	t.Helper()
	bin := MosquittoBinary
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("mosquitto")
		if lerr != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("mqtttest: mosquitto not found (%s, PATH): install it (apt-get install mosquitto)", bin)
			}
			t.Skipf("mqtttest: mosquitto not found (%s, PATH); apt-get install mosquitto", bin)
		}
		bin = p
	}
	m := &Mosquitto{t: t, bin: bin, dir: t.TempDir(), log: &testkit.SyncBuffer{}, extra: extra}
	if err := os.Mkdir(filepath.Join(m.dir, "data"), 0o700); err != nil {
		t.Fatalf("mqtttest: %v", err)
	}
	t.Cleanup(func() {
		m.kill()
		if t.Failed() {
			t.Logf("mosquitto log:\n%s", m.log.String())
		}
	})
	// A free port can be taken between our probe and mosquitto's bind:
	// try a few.
	for attempt := 1; ; attempt++ {
		m.port = testkit.FreePort(t)
		if err := m.writeConf(); err != nil {
			t.Fatalf("mqtttest: %v", err)
		}
		err := m.start()
		if err == nil {
			return m
		}
		if attempt == 3 {
			t.Fatalf("mqtttest: mosquitto did not start: %v\n%s", err, m.log.String())
		}
	}
}

// writeConf writes configs/mosquitto.conf for this broker
// (configs.LocalMosquittoConf): its port, its data directory, logging to
// stdout (kept in a buffer).
func (m *Mosquitto) writeConf() error {
	extra := append([]string(nil), m.extra...)
	if os.Getenv("MQTTTEST_VERBOSE") != "" { // every packet, for debugging
		extra = append(extra, "log_type all")
	}
	conf, err := configs.LocalMosquittoConf(m.port, filepath.Join(m.dir, "data"), "stdout", os.Geteuid() == 0, extra...)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(m.dir, "mosquitto.conf"), conf, 0o600)
}

func (m *Mosquitto) start() error {
	p := testkit.StartProc(m.t, testkit.ProcOptions{Out: m.log, StopSignal: syscall.SIGKILL},
		m.bin, "-c", filepath.Join(m.dir, "mosquitto.conf"))
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", m.Addr(), 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("mosquitto exited")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.kill()
			return fmt.Errorf("mosquitto does not accept connections on %s after 10s", m.Addr())
		}
	}
}

// Addr is 127.0.0.1:port.
func (m *Mosquitto) Addr() string { return "127.0.0.1:" + strconv.Itoa(m.port) }

// URL is tcp://127.0.0.1:port.
func (m *Mosquitto) URL() string { return "tcp://" + m.Addr() }

// DataDir is the persistence_location.
func (m *Mosquitto) DataDir() string { return filepath.Join(m.dir, "data") }

// Log returns what mosquitto logged so far.
func (m *Mosquitto) Log() string { return m.log.String() }

// Stop sends SIGTERM (mosquitto saves its database) and waits for the
// process to exit. A no-op when it is not running.
func (m *Mosquitto) Stop() {
	m.t.Helper()
	m.signal(syscall.SIGTERM, 10*time.Second)
}

// Kill sends SIGKILL and waits: whatever mosquitto had not saved yet (see
// autosave_interval) is lost, as in a crash.
func (m *Mosquitto) Kill() {
	m.t.Helper()
	m.kill()
}

func (m *Mosquitto) kill() { m.signal(syscall.SIGKILL, 10*time.Second) }

func (m *Mosquitto) signal(sig syscall.Signal, wait time.Duration) {
	m.mu.Lock()
	p := m.proc
	m.proc = nil
	m.mu.Unlock()
	if p == nil {
		return
	}
	if _, ok := p.Wait(0); ok {
		return
	}
	_ = p.Signal(sig)
	if _, ok := p.Wait(wait); !ok {
		p.Kill()
		m.t.Errorf("mqtttest: mosquitto did not exit within %s of %v; killed", wait, sig)
	}
}

// Restart stops mosquitto if it runs and starts it again on the same port
// with the same data.
func (m *Mosquitto) Restart() {
	m.t.Helper()
	m.Stop()
	if err := m.start(); err != nil {
		m.t.Fatalf("mqtttest: mosquitto restart: %v\n%s", err, m.log.String())
	}
}

// Wipe deletes the persisted database; only while mosquitto is stopped.
func (m *Mosquitto) Wipe() {
	m.t.Helper()
	m.mu.Lock()
	running := m.proc != nil
	m.mu.Unlock()
	if running {
		m.t.Fatal("mqtttest: Wipe while mosquitto runs")
	}
	if err := os.RemoveAll(m.DataDir()); err != nil {
		m.t.Fatal(err)
	}
	if err := os.Mkdir(m.DataDir(), 0o700); err != nil {
		m.t.Fatal(err)
	}
}

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

// A closed broker (docs/operations.md, "Closing the broker"): TLS, a
// password file made by the real mosquitto_passwd, and the shipped ACL
// (configs/mosquitto.acl). The agent and edgectl connect; a client
// without credentials, with a wrong password, without TLS, or under the
// agent's client ID does not; the ACL keeps a monitor from publishing
// commands.

// passwdFile makes a password file with mosquitto_passwd.
func passwdFile(t *testing.T, users ...[2]string) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Fatal("mosquitto_passwd not found (apt-get install mosquitto):", err)
	}
	f := filepath.Join(t.TempDir(), "passwd")
	for i, u := range users {
		args := []string{"-b", f, u[0], u[1]}
		if i == 0 {
			args = append([]string{"-c"}, args...)
		}
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v %s", err, out)
		}
	}
	return f
}

func writeFile(t *testing.T, content string) string {
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// tryConnect connects a client and reports the error (nil: connected).
func tryConnect(url, id, user, pass string, tc *tls.Config) error {
	o := paho.NewClientOptions().AddBroker(url).SetClientID(id).SetUsername(user).SetPassword(pass).
		SetTLSConfig(tc).SetConnectTimeout(3 * time.Second).SetAutoReconnect(false)
	c := paho.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(5 * time.Second) {
		return fmt.Errorf("connect timed out")
	}
	if tok.Error() == nil {
		c.Disconnect(50)
	}
	return tok.Error()
}

func caConfig(t *testing.T, caFile string) *tls.Config {
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &tls.Config{RootCAs: pool}
}

// edgectlSend runs the real edgectl binary.
func edgectlSend(t *testing.T, args ...string) (int, string) {
	t.Helper()
	bin := testkit.Build(t, "../cmd/edgectl")
	out, err := exec.Command(bin, append([]string{"send", "--gateway", gw, "--timeout", "10s"}, args...)...).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, string(out)
}

func TestEmbeddedBrokerClosed(t *testing.T) {
	pw := passwdFile(t, [2]string{"ctl-a", "pa55"}, [2]string{"monitor", "look"})
	pwFile := writeFile(t, "pa55\n")
	monFile := writeFile(t, "look\n")
	tf := testkit.MakeTLS(t)
	s := sim.StartForTest(t, map[string]string{"pump-7": "pump"})
	listen := testkit.FreeAddr(t)
	cfgText := fmt.Sprintf(`gateway_id: %s
data_dir: %s
mqtt:
  broker: embedded
  embedded_listen: %s
  client_id: edge-agent-e2e
  embedded_password_file: %s
  embedded_acl_file: ../configs/mosquitto.acl
  embedded_tls: {cert_file: %s, key_file: %s}
admin: {listen: ""}
devices:
  - {id: pump-7, type: pump, driver: {url: %q, idempotent: true, queryable: true}}
`, gw, filepath.Join(t.TempDir(), "data"), listen, pw, tf.ServerCert, tf.ServerKey, s.URL())
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	a := app.New(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	}()
	testkit.Eventually(t, 10*time.Second, "the agent connected to its broker", func() bool { return a.Ready() == nil })

	url := "ssl://" + listen
	if a.BrokerURL() != url {
		t.Fatalf("BrokerURL %s, want %s", a.BrokerURL(), url)
	}
	tc := caConfig(t, tf.CA)
	for _, tt := range []struct {
		name, url, id, user, pass string
		tc                        *tls.Config
	}{
		{"anonymous", url, "anon", "", "", tc},
		{"a wrong password", url, "c1", "ctl-a", "nope", tc},
		{"an unknown user", url, "c2", "mallory", "pa55", tc},
		{"without TLS", "tcp://" + listen, "c3", "ctl-a", "pa55", nil},
		{"the agent's client ID", url, "edge-agent-e2e", "ctl-a", "pa55", tc},
	} {
		if err := tryConnect(tt.url, tt.id, tt.user, tt.pass, tt.tc); err == nil {
			t.Errorf("%s: connected", tt.name)
		}
	}
	if err := tryConnect(url, "c4", "ctl-a", "pa55", tc); err != nil {
		t.Fatalf("ctl-a with its password: %v", err)
	}

	code, out := edgectlSend(t, "--broker", url, "--cafile", tf.CA, "--username", "ctl-a", "--password-file", pwFile,
		"--device", "pump-7", "--action", "set", "--param", "rpm=500", "--fence", "3")
	if code != 0 || !strings.Contains(out, `"code": "ok"`) {
		t.Fatalf("edgectl send through the closed broker: exit %d\n%s", code, out)
	}
	// The monitor may read but not publish commands (the ACL): its
	// command never reaches the agent.
	code, out = edgectlSend(t, "--broker", url, "--cafile", tf.CA, "--username", "monitor", "--password-file", monFile,
		"--device", "pump-7", "--action", "set", "--param", "rpm=900", "--fence", "3", "--timeout", "3s")
	if code == 0 {
		t.Fatalf("the monitor's command was applied:\n%s", out)
	}
	if j := s.Journal(); len(j) != 1 {
		t.Fatalf("journal %+v", j)
	}
}

func TestMosquittoClosed(t *testing.T) {
	c := startClosedMosquittos(t, 1)
	url := "ssl://" + c.nodes[0].Addr()
	tc := caConfig(t, c.tls.CA)
	if err := tryConnect(url, "anon", "", "", tc); err == nil {
		t.Error("an anonymous client connected")
	}
	if err := tryConnect(url, "c1", "ctl-a", "wrong", tc); err == nil {
		t.Error("a wrong password connected")
	}
	if code, out := c.send(t, url, "3"); code != 0 || !strings.Contains(out, `"code": "ok"`) {
		t.Fatalf("edgectl send through mosquitto (credentials from the environment): exit %d\n%s\n%s", code, out, c.nodes[0].Log())
	}
}

// A broker list over TLS with passwords (docs/protocol.md §9): the agent
// and edgectl take ssl:// nodes with one CA and one set of credentials;
// when the agent's node is killed it moves to the next, still closed.
func TestMosquittoClosedBrokerList(t *testing.T) {
	c := startClosedMosquittos(t, 2)
	n1, n2 := "ssl://"+c.nodes[0].Addr(), "ssl://"+c.nodes[1].Addr()
	if got := c.agent.BrokerURL(); got != n1 {
		t.Fatalf("the agent is on %s, want the first node %s", got, n1)
	}
	if code, out := c.send(t, n1+","+n2, "3"); code != 0 || !strings.Contains(out, `"code": "ok"`) {
		t.Fatalf("edgectl send with two nodes: exit %d\n%s", code, out)
	}
	c.nodes[0].Kill()
	if tryConnect(n1, "c2", "ctl-a", "pa55", caConfig(t, c.tls.CA)) == nil {
		t.Fatal("the first node still answers after its kill")
	}
	testkit.Eventually(t, 30*time.Second, "the agent on the second node", func() bool {
		return c.agent.BrokerURL() == n2 && c.agent.Ready() == nil
	})
	if code, out := c.send(t, n1+","+n2, "4"); code != 0 || !strings.Contains(out, `"code": "ok"`) || !strings.Contains(out, `"last_fence": 4`) {
		t.Fatalf("edgectl send after node 1 died: exit %d\n%s\n%s", code, out, c.nodes[1].Log())
	}
	if tryConnect(n2, "anon", "", "", caConfig(t, c.tls.CA)) == nil {
		t.Error("an anonymous client connected to the second node")
	}
}

// closedMosquittos is n mosquittos with TLS, a password file and the
// shipped ACL, and an agent (in process) connected to them as mqtt.brokers
// (mqtt.broker for one) with its password and the CA.
type closedMosquittos struct {
	nodes []*mqtttest.Mosquitto
	tls   testkit.TLSFiles
	agent *app.App
}

func startClosedMosquittos(t *testing.T, n int) *closedMosquittos {
	t.Helper()
	pw := passwdFile(t, [2]string{"edge-agent", "agent-pw"}, [2]string{"ctl-a", "pa55"})
	agentPW, ctlPW := writeFile(t, "agent-pw\n"), writeFile(t, "pa55\n")
	c := &closedMosquittos{tls: testkit.MakeTLS(t)}
	acl, err := filepath.Abs("../configs/mosquitto.acl")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for range n {
		m := mqtttest.StartMosquitto(t, "cafile "+c.tls.CA, "certfile "+c.tls.ServerCert, "keyfile "+c.tls.ServerKey,
			"allow_anonymous false", "password_file "+pw, "acl_file "+acl)
		c.nodes = append(c.nodes, m)
		urls = append(urls, "ssl://"+m.Addr())
	}
	brokers := "broker: " + urls[0]
	if n > 1 {
		brokers = "brokers: [" + strings.Join(urls, ", ") + "]"
	}
	s := sim.StartForTest(t, map[string]string{"pump-7": "pump"})
	cfgText := fmt.Sprintf(`gateway_id: %s
data_dir: %s
mqtt:
  %s
  client_id: edge-agent-e2e
  username: edge-agent
  password_file: %s
  tls: {ca_file: %s}
admin: {listen: ""}
devices:
  - {id: pump-7, type: pump, driver: {url: %q, idempotent: true, queryable: true}}
`, gw, filepath.Join(t.TempDir(), "data"), brokers, agentPW, c.tls.CA, s.URL())
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	c.agent = app.New(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))})
	if err := c.agent.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.agent.Stop(ctx)
	})
	testkit.Eventually(t, 15*time.Second, "the agent connected to mosquitto", func() bool { return c.agent.Ready() == nil })
	t.Setenv("EDGECTL_USERNAME", "ctl-a")
	t.Setenv("EDGECTL_PASSWORD_FILE", ctlPW)
	return c
}

// send runs edgectl send to pump-7 through brokers (a comma-separated
// list) with the CA and the controller's credentials from the environment.
func (c *closedMosquittos) send(t *testing.T, brokers, fence string) (int, string) {
	t.Helper()
	return edgectlSend(t, "--broker", brokers, "--cafile", c.tls.CA, "--device", "pump-7", "--action", "set", "--param", "rpm=500", "--fence", fence)
}

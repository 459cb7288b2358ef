package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/app"
	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/mqtttest"
)

func TestKeygen(t *testing.T) {
	name := filepath.Join(t.TempDir(), "ctl-a")
	if code, out, errb := runCLI("keygen", "--out", name); code != 0 || !strings.Contains(out, "ctl-a.pub") {
		t.Fatalf("keygen: %d %q %q", code, out, errb)
	}
	st, err := os.Stat(name + ".key")
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key file: %v %v, want mode 0600", st.Mode(), err)
	}
	priv, _ := os.ReadFile(name + ".key")
	pub, _ := os.ReadFile(name + ".pub")
	k, err := jws.ParsePrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jws.ParsePublicKeys(pub)
	if err != nil || !p[0].Equal(k.Public()) {
		t.Fatalf("public key: %v", err)
	}
	// Never overwritten.
	if code, _, errb := runCLI("keygen", "--out", name); code != 1 || !strings.Contains(errb, "exists; not overwritten") {
		t.Fatalf("second keygen: %d %q", code, errb)
	}
	if again, _ := os.ReadFile(name + ".key"); string(again) != string(priv) {
		t.Fatal("the private key was overwritten")
	}
	if code, _, _ := runCLI("keygen"); code != 2 {
		t.Fatalf("keygen without --out: exit %d", code)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI("--version")
	if code != 0 || !strings.HasPrefix(out, "edgectl "+Version+" (commit ") || !strings.Contains(out, "linux/") {
		t.Fatalf("--version: %d %q", code, out)
	}
}

func TestConnectionFlagsAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	t.Setenv("EDGECTL_BROKER", "tcp://127.0.0.1:1883")
	t.Setenv("EDGECTL_USERNAME", "env-user")
	t.Setenv("EDGECTL_PASSWORD_FILE", pw)
	var m mqttFlags
	o, err := m.options("gw", "edge")
	if err != nil || o.Broker != "tcp://127.0.0.1:1883" || o.Username != "env-user" || o.Password != "s3cret" || o.TLS != nil {
		t.Fatalf("from the environment: %+v %v", o, err)
	}
	m = mqttFlags{broker: "tcp://h:1", username: "flag-user"}
	if o, _ = m.options("gw", "edge"); o.Broker != "tcp://h:1" || o.Username != "flag-user" {
		t.Fatalf("flags win over the environment: %+v", o)
	}
	m = mqttFlags{broker: "tcp://n1:1,tcp://n2:1"}
	if o, err = m.options("gw", "edge"); err != nil || o.Broker != "" || strings.Join(o.Brokers, " ") != "tcp://n1:1 tcp://n2:1" {
		t.Fatalf("a list of nodes: %+v %v", o, err)
	}
	for _, tt := range []struct {
		m    mqttFlags
		want string
	}{
		{mqttFlags{broker: "tcp://n1:1,"}, "an empty URL in the list"},
		{mqttFlags{broker: "ssl://n1:1,tcp://n2:1", cafile: pw}, "need an ssl:// broker"},
		{mqttFlags{broker: "ssl://h:1", cert: "c"}, "--cert and --key go together"},
		{mqttFlags{broker: "tcp://h:1", cafile: pw}, "need an ssl:// broker"},
		{mqttFlags{broker: "ssl://h:1", cafile: pw}, "no PEM certificate"},
		{mqttFlags{broker: "ssl://h:1", passwordFile: "/nonexistent"}, "--password-file"},
		{mqttFlags{broker: "ssl://h:1", gatewayKey: pw}, "--gateway-key"},
	} {
		if _, err := tt.m.options("gw", "edge"); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.m, err, tt.want)
		}
	}
	os.Unsetenv("EDGECTL_BROKER")
	code, _, errb := runCLI("send", "--gateway", "g", "--device", "d", "--action", "set", "--fence", "1")
	if code != 2 || !strings.Contains(errb, "--broker is required") {
		t.Fatalf("no broker: %d %q", code, errb)
	}
	if code, _, errb := runCLI("send", "--broker", "tcp://h:1", "--gateway", "g", "--device", "d", "--action", "set", "--fence", "1", "--sign-key", pw); code != 2 || !strings.Contains(errb, "go together") {
		t.Fatalf("--sign-key without --key-id: %d %q", code, errb)
	}
}

// resolve posts the operator's answer with the token, to the documented
// endpoint, and prints the final Result.
func TestResolve(t *testing.T) {
	var got struct {
		path, auth string
		body       map[string]bool
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.path, got.auth = r.Method+" "+r.URL.Path, r.Header.Get("Authorization")
		json.NewDecoder(r.Body).Decode(&got.body)
		if got.auth != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"Authorization: Bearer <admin.token> required"}`)
			return
		}
		json.NewEncoder(w).Encode(wire.Result{V: 1, OpID: "op-9", Device: "valve-1", Status: wire.StatusFailed, Code: wire.CodeNotApplied})
	}))
	defer srv.Close()
	t.Setenv("EDGECTL_TOKEN", "tok")
	code, out, errb := runCLI("resolve", "--admin", srv.URL, "--device", "valve-1", "--op-id", "op-9", "--applied=false")
	if code != 0 || got.path != "POST /v1/devices/valve-1/ops/op-9/resolve" || got.body["applied"] || !strings.Contains(out, `"not_applied"`) {
		t.Fatalf("resolve: %d %q %q, server saw %+v", code, out, errb, got)
	}
	code, _, errb = runCLI("resolve", "--admin", srv.URL, "--device", "valve-1", "--op-id", "op-9", "--applied=true", "--token", "wrong")
	if code != 1 || !strings.Contains(errb, "401") {
		t.Fatalf("wrong token: %d %q", code, errb)
	}
	if code, _, errb := runCLI("resolve", "--admin", srv.URL, "--device", "valve-1", "--op-id", "op-9"); code != 2 || !strings.Contains(errb, "--applied") {
		t.Fatalf("without --applied: %d %q", code, errb)
	}
}

// edgectl send --sign-key --key-id against a real agent that requires
// signed commands: applied; the same without a key: unauthorized, exit 1.
func TestSendSignedToTheAgent(t *testing.T) {
	dir := t.TempDir()
	if code, _, errb := runCLI("keygen", "--out", filepath.Join(dir, "ctl-a")); code != 0 {
		t.Fatal(errb)
	}
	broker := mqtttest.StartMosquitto(t).URL()
	s := sim.StartForTest(t, map[string]string{"pump-7": "pump"})
	cfgText := "gateway_id: gw-1\ndata_dir: " + filepath.Join(dir, "data") + "\nmqtt: {broker: \"" + broker + "\"}\nadmin: {listen: \"\"}\n" +
		"security: {keys: [{id: ctl-a, public_key_file: \"" + filepath.Join(dir, "ctl-a.pub") + "\"}]}\n" +
		"devices:\n  - {id: pump-7, type: pump, driver: {url: \"" + s.URL() + "\", idempotent: true, queryable: true}}\n"
	cfg, err := config.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	a := app.New(cfg, app.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Stop(ctx)
	}()
	testkit.Eventually(t, 10*time.Second, "agent subscribed", func() bool { return a.Ready() == nil })

	base := []string{"send", "--broker", broker, "--gateway", "gw-1", "--device", "pump-7", "--action", "set", "--param", "rpm=900", "--fence", "5", "--timeout", "15s", "--json"}
	code, out, errb := runCLI(append(base, "--sign-key", filepath.Join(dir, "ctl-a.key"), "--key-id", "ctl-a")...)
	var r wire.Result
	if code != 0 || json.Unmarshal([]byte(strings.TrimSpace(out)), &r) != nil || r.Code != wire.CodeOK {
		t.Fatalf("signed send: exit %d, %q %q", code, out, errb)
	}
	code, out, _ = runCLI(base...)
	if code != 1 || json.Unmarshal([]byte(strings.TrimSpace(out)), &r) != nil || r.Code != wire.CodeUnauthorized {
		t.Fatalf("unsigned send: exit %d, %q", code, out)
	}
	if j := s.Journal(); len(j) != 1 {
		t.Fatalf("journal %+v", j)
	}
}

package mosq

import (
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPasswordsFromMosquittoPasswd: a file written by the real
// mosquitto_passwd (Debian's mosquitto package, which make test's
// .ci/run installs) is read, and checks as mosquitto would.
func TestPasswordsFromMosquittoPasswd(t *testing.T) {
	bin, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Fatal("mosquitto_passwd not found (apt-get install mosquitto):", err)
	}
	f := filepath.Join(t.TempDir(), "passwd")
	for i, up := range [][2]string{{"agent", "s3cret"}, {"ctl-a", "pa:ss word"}} {
		args := []string{"-b", f, up[0], up[1]}
		if i == 0 {
			args = append([]string{"-c"}, args...)
		}
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v: %s", err, out)
		}
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "ctl-a:$7$") {
		t.Fatalf("mosquitto_passwd wrote %s, expected $7$ hashes", b)
	}
	p, err := ParsePasswords(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		user, pw string
		ok       bool
	}{
		{"agent", "s3cret", true}, {"ctl-a", "pa:ss word", true},
		{"agent", "s3cret ", false}, {"agent", "", false}, {"ctl-a", "s3cret", false}, {"nobody", "s3cret", false},
	} {
		if got := p.Check(tt.user, []byte(tt.pw)); got != tt.ok {
			t.Errorf("Check(%q, %q) = %v, want %v", tt.user, tt.pw, got, tt.ok)
		}
	}
	if p.Users() != 2 {
		t.Fatalf("%d users", p.Users())
	}
}

func TestPasswordsSHA512AndRefusals(t *testing.T) {
	salt := []byte("0123456789ab")
	s := sha512.New()
	s.Write([]byte("old"))
	s.Write(salt)
	line := "legacy:$6$" + base64.StdEncoding.EncodeToString(salt) + "$" + base64.StdEncoding.EncodeToString(s.Sum(nil))
	p, err := ParsePasswords([]byte("# a comment\n\n" + line + "\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Check("legacy", []byte("old")) || p.Check("legacy", []byte("new")) {
		t.Fatal("$6$ hash does not check")
	}
	for _, tt := range []struct{ in, want string }{
		{"alice:plain", "line 1 (user \"alice\"): not a mosquitto_passwd hash"},
		{"alice", "line 1: want username:hash"},
		{":$6$YQ==$YQ==", "line 1: want username:hash"},
		{line + "\n" + line, `line 2: user "legacy" appears twice`},
		{"a:$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA", "$argon2id$ is not supported"},
		{"a:$7$999999999$YQ==$YQ==", "iterations"},
		{"a:$7$101$!!$YQ==", "salt is not base64"},
		{"a:$7$101$YQ==$YQ==", "hash is not 64 bytes"},
	} {
		if _, err := ParsePasswords([]byte(tt.in)); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestACL(t *testing.T) {
	a, err := ParseACL([]byte(`# anonymous clients may only read states
topic read edge/+/devices/+/state

user agent
topic readwrite edge/#

user ctl-a
topic write edge/gw-1/devices/pump-7/cmd
topic deny edge/gw-1/devices/pump-7/result
topic edge/gw-1/devices/+/result

# every controller may read its own reply topic
pattern read edge/+/controllers/%c/reply
pattern write clients/%u/out
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		user, client, topic string
		write, want         bool
	}{
		{"", "x", "edge/gw-1/devices/pump-7/state", false, true},
		{"", "x", "edge/gw-1/devices/pump-7/state", true, false},
		{"", "x", "edge/+/devices/+/state", false, true},
		{"", "x", "edge/#", false, false},
		{"", "x", "edge/gw-1/devices/pump-7/cmd", true, false},
		{"agent", "a", "edge/gw-1/devices/pump-7/result", true, true},
		{"agent", "a", "edge/gw-1/devices/+/cmd", false, true},
		{"agent", "a", "other/x", true, false},
		{"ctl-a", "c1", "edge/gw-1/devices/pump-7/cmd", true, true},
		{"ctl-a", "c1", "edge/gw-1/devices/pump-7/cmd", false, false},
		{"ctl-a", "c1", "edge/gw-1/devices/pump-8/cmd", true, false},
		{"ctl-a", "c1", "edge/gw-1/devices/valve-1/result", false, true},
		{"ctl-a", "c1", "edge/gw-1/devices/pump-7/result", false, false}, // deny wins
		{"ctl-a", "c1", "edge/gw-1/devices/+/result", false, true},       // the subscription; pump-7's results are still denied one by one (the row above)
		{"ctl-a", "c1", "edge/gw-1/controllers/c1/reply", false, true},
		{"ctl-a", "c1", "edge/gw-1/controllers/c2/reply", false, false},
		{"ctl-a", "c1", "edge/gw-1/controllers/+/reply", false, false},
		{"ctl-a", "c1", "clients/ctl-a/out", true, true},
		{"", "c1", "clients//out", true, false}, // %u without a username
		{"ctl-a", "c+", "edge/gw-1/controllers/c+/reply", false, false},
		{"nobody", "n", "edge/gw-1/devices/pump-7/state", false, false}, // anonymous lines are for anonymous clients
	} {
		if got := a.Allowed(tt.user, tt.client, tt.topic, tt.write); got != tt.want {
			t.Errorf("Allowed(%q, %q, %q, write %v) = %v, want %v", tt.user, tt.client, tt.topic, tt.write, got, tt.want)
		}
	}
	for _, tt := range []struct{ in, want string }{
		{"topic", "line 1: topic needs a topic"},
		{"user", "line 1: user needs a name"},
		{"topic read a/#/b", `"a/#/b" is not a valid topic filter`},
		{"allow a", `"allow": want topic, pattern or user`},
	} {
		if _, err := ParseACL([]byte(tt.in)); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestCoversDollarTopics(t *testing.T) {
	if covers("#", "$SYS/broker") || covers("+/broker", "$SYS/broker") || !covers("$SYS/#", "$SYS/broker") {
		t.Fatal("wildcards at the first level must not match $ topics")
	}
}

func FuzzParseFiles(f *testing.F) {
	f.Add([]byte("a:$7$101$svQ7muRhC6dDCFT2$4wF0jmEMuOvE+74l25i7tfK6ezxoX8dMhHKYrpodn76JAVhRdmpR1AAKPUB+2ZDbcjLXYKaHEwVDLrYtoM35IQ==\n"), "a/b")
	f.Add([]byte("user x\ntopic read a/+/b\npattern write c/%u/%c\n"), "c/x/y")
	f.Fuzz(func(t *testing.T, b []byte, topic string) {
		if p, err := ParsePasswords(b); err == nil {
			p.Check("a", []byte("x"))
		}
		if a, err := ParseACL(b); err == nil {
			a.Allowed("x", "y", topic, true)
			a.Allowed("", "y", topic, false)
		}
	})
}

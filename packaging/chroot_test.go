package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The package's whole life in a real Debian root, with the real dpkg and
// adduser: install, the service's user running the packaged agent on the
// packaged configuration (in a network namespace of its own, so the
// configuration's fixed loopback ports are free), an upgrade that keeps an
// administrator's edit of the conffile, remove, purge. It needs root, a
// root file system made by `debootstrap --variant=minbase
// --include=adduser,procps bookworm DIR` named by EDGE_DEB_CHROOT, unshare, ip and
// curl; `make deb-check` prepares it. Skipped otherwise.
func TestDebLifecycleInAChroot(t *testing.T) {
	root := os.Getenv("EDGE_DEB_CHROOT")
	if root == "" {
		t.Skip("EDGE_DEB_CHROOT not set (make deb-check)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot, unshare)")
	}
	for _, tool := range []string{"chroot", "unshare", "ip", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/dpkg")); err != nil {
		t.Fatalf("EDGE_DEB_CHROOT=%s is not a Debian root: %v", root, err)
	}
	arch, goenv, _ := debArch(t)
	var debs []string
	for _, v := range []string{"1.0.0", "1.0.1"} {
		deb, err := buildDeb(debInputs(t, arch, goenv, v, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		in := filepath.Join("/tmp", filepath.Base(deb))
		b, err := os.ReadFile(deb)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, in), b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(filepath.Join(root, in)) })
		debs = append(debs, in)
	}
	in := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("chroot", append([]string{root}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("chroot %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	stat := func(path string) string { t.Helper(); return in("stat", "-c", "%U:%G %a", path) }
	// Leave the root as it was found, whatever happens.
	t.Cleanup(func() {
		exec.Command("chroot", root, "dpkg", "--purge", "edge-agent").Run()
		exec.Command("chroot", root, "deluser", "--system", "--quiet", "edge-agent").Run()
	})

	in("dpkg", "-i", debs[0])
	if u := in("getent", "passwd", "edge-agent"); !strings.HasSuffix(u, ":/var/lib/edge-agent:/usr/sbin/nologin") {
		t.Errorf("user: %s", u)
	}
	for path, want := range map[string]string{
		"/var/lib/edge-agent":        "edge-agent:edge-agent 750",
		"/etc/edge-agent/agent.yaml": "root:edge-agent 640",
		"/usr/bin/edge-agent":        "root:root 755",
	} {
		if got := stat(path); got != want {
			t.Errorf("%s: %s, want %s", path, got, want)
		}
	}
	if got := in("dpkg-query", "-W", "-f=${Conffiles}", "edge-agent"); !strings.HasPrefix(got, "/etc/edge-agent/agent.yaml ") {
		t.Errorf("conffiles: %q", got)
	}
	// deb-systemd-helper enabled the unit (no systemd runs in the root:
	// the links are what systemd would find at boot).
	wants := filepath.Join(root, "etc/systemd/system/multi-user.target.wants/edge-agent.service")
	// (bookworm's links name /lib/systemd/system, the same directory.)
	if dst, err := os.Readlink(wants); err != nil || filepath.Base(dst) != "edge-agent.service" {
		t.Errorf("not enabled: %s -> %q %v", wants, dst, err)
	} else if _, err := os.Stat(filepath.Join(root, dst)); err != nil {
		t.Errorf("enabled as %s, which is not the unit: %v", dst, err)
	}
	mask := filepath.Join(root, "etc/systemd/system/edge-agent.service")

	// The service's user runs the packaged agent on the packaged config.
	script := `set -e
ip link set lo up
chroot --userspec=edge-agent:edge-agent "$1" /usr/bin/edge-agent run --config /etc/edge-agent/agent.yaml >"$2" 2>&1 &
pid=$!
i=0
until curl -sf http://127.0.0.1:9464/readyz >/dev/null; do
	i=$((i+1)); [ $i -lt 300 ] || { echo "not ready"; kill $pid; exit 1; }
	sleep 0.1
done
echo ready
kill -TERM $pid
wait $pid
`
	logPath := filepath.Join(t.TempDir(), "agent.log")
	out, err := exec.Command("unshare", "--net", "sh", "-c", script, "sh", root, logPath).CombinedOutput()
	log, _ := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(out), "ready") || !strings.Contains(string(log), "stopped cleanly") {
		t.Fatalf("running the packaged agent as edge-agent: %v\n%s\nagent log:\n%s", err, out, log)
	}
	if got := stat("/var/lib/edge-agent/agent.db"); got != "edge-agent:edge-agent 600" {
		t.Errorf("agent.db: %s", got)
	}

	// An administrator's edit survives an upgrade.
	in("sed", "-i", "s/^gateway_id: gw-1 /gateway_id: gw-site-9 /", "/etc/edge-agent/agent.yaml")
	in("dpkg", "-i", debs[1])
	if got := in("grep", "^gateway_id:", "/etc/edge-agent/agent.yaml"); !strings.HasPrefix(got, "gateway_id: gw-site-9 ") {
		t.Errorf("after the upgrade: %q", got)
	}
	if got := in("dpkg-query", "-W", "-f=${Version}", "edge-agent"); got != "1.0.1-1" {
		t.Errorf("after the upgrade dpkg says %q", got)
	}

	// Remove keeps the configuration and the state; purge deletes both.
	in("dpkg", "-r", "edge-agent")
	if dst, err := os.Readlink(mask); err != nil || dst != "/dev/null" {
		t.Errorf("dpkg -r did not mask the unit: %q %v", dst, err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/edge-agent")); err == nil {
		t.Error("the binary survived dpkg -r")
	}
	for _, p := range []string{"etc/edge-agent/agent.yaml", "var/lib/edge-agent/agent.db"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("dpkg -r deleted %s", p)
		}
	}
	in("dpkg", "-P", "edge-agent")
	for _, p := range []string{mask, wants} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("dpkg -P left %s", p)
		}
	}
	for _, p := range []string{"etc/edge-agent", "var/lib/edge-agent"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("dpkg -P left %s", p)
		}
	}
	if u := in("getent", "passwd", "edge-agent"); u == "" {
		t.Error("purge removed the user (Debian keeps it)")
	}
}

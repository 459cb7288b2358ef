package app

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// addrInUse explains a failure to bind the embedded broker's listen
// address because something else holds it: most often mosquitto, which
// Debian starts on 127.0.0.1:1883 when it is installed. It names the
// process when /proc lets it see one, and says what to change. It is nil
// for any other error.
func addrInUse(err error, listen string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return nil
	}
	who := "another process (`ss -ltnp` names it)"
	if _, port, perr := net.SplitHostPort(listen); perr == nil {
		if p, aerr := strconv.Atoi(port); aerr == nil {
			if name, pid := listenerProcess(p); name != "" {
				who = fmt.Sprintf("%s (pid %d)", name, pid)
			}
		}
	}
	var cause error = err
	var op *net.OpError
	if errors.As(err, &op) {
		cause = op // listen tcp ADDR: bind: address already in use
	}
	return fmt.Errorf("mqtt.embedded_listen %s is taken by %s: to use that broker instead, set mqtt.broker: tcp://%s "+
		"without embedded_listen (agent-mosquitto.yaml, in configs/ or /usr/share/doc/edge-agent/examples/); "+
		"or stop it; or move embedded_listen to a free port: %w", listen, who, listen, cause)
}

// listenerProcess finds the process holding a TCP socket listening on
// port: the socket's inode in /proc/net/tcp{,6}, then a /proc/PID/fd link
// to it. It returns "" where /proc is missing or hides the process
// (another user's, or ProtectProc=invisible under systemd).
func listenerProcess(port int) (name string, pid int) {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for inode := range listeningInodes(f, port) {
			inodes[inode] = true
		}
	}
	if len(inodes) == 0 {
		return "", 0
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		link, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if !inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			continue
		}
		dir := filepath.Dir(filepath.Dir(fd))
		pid, _ = strconv.Atoi(filepath.Base(dir))
		if pid == os.Getpid() {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil {
			continue
		}
		return strings.TrimSpace(string(comm)), pid
	}
	return "", 0
}

// listeningInodes yields the inodes of the sockets in LISTEN state (0A)
// on port in one of /proc/net/tcp's tables.
func listeningInodes(table string, port int) map[string]bool {
	f, err := os.Open(table)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]bool{}
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" || !strings.HasSuffix(fields[1], want) {
			continue
		}
		out[fields[9]] = true
	}
	return out
}

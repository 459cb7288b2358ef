// Package controllertest tests the controller SDK (the module in
// controller/) against real etcd clusters, mosquitto, the agent and the
// firmware simulator. The tests live in the agent's module because they
// use its test kit (internal/testkit), which the SDK's module must not
// require: a program that imports the SDK gets none of it.
package controllertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/internal/testkit"
	"github.com/edge-agent/edge-agent/internal/testkit/etcdtest"
)

// TestMain lets the test binary run as a separate holder process
// (CONTROLLER_TEST_HELPER=hold), so tests can SIGKILL or SIGSTOP a real
// process holding a lock.
func TestMain(m *testing.M) {
	if os.Getenv("CONTROLLER_TEST_HELPER") == "hold" {
		os.Exit(helperHold())
	}
	testkit.Main(m)
}

// helperHold acquires one lock and then obeys stdin: "check" prints the
// ownership check, "release" releases, "exit" exits. Every state change is
// printed as "STATE <name>".
func helperHold() int {
	eps := strings.Split(os.Getenv("HELPER_ETCD"), ",")
	ttl, _ := time.ParseDuration(os.Getenv("HELPER_TTL"))
	cli, err := etcdtest.NewClient(eps)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer cli.Close()
	out := make(chan string, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for l := range out {
			fmt.Println(l)
		}
	}()
	defer func() { close(out); wg.Wait() }()
	h := controller.NewHolder(cli, []string{os.Getenv("HELPER_LOCK")}, &controller.LockOptions{
		TTL: ttl, AcquireTimeout: 10 * time.Second, Name: "helper",
		OnState: func(_, to controller.State) { out <- "STATE " + to.String() },
	})
	if err := h.Acquire(context.Background()); err != nil {
		out <- "ERROR " + err.Error()
		return 1
	}
	var sender *controller.Sender
	if broker := os.Getenv("HELPER_BROKER"); broker != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: broker, Gateway: os.Getenv("HELPER_GATEWAY")})
		cancel()
		if err != nil {
			out <- "ERROR " + err.Error()
			return 1
		}
		defer conn.Close()
		sender = controller.NewSender(conn, h, nil)
	}
	out <- "FENCE " + strconv.FormatInt(h.Fence(), 10)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if op, ok := strings.CutPrefix(sc.Text(), "send "); ok && sender != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, err := sender.Send(ctx, "pump-7", "set", map[string]any{"rpm": 1500}, controller.WithOpID(op))
			cancel()
			out <- fmt.Sprintf("SENT %s %s %v", op, r.Code, err)
			continue
		}
		switch sc.Text() {
		case "check":
			out <- fmt.Sprintf("CHECK %s %v", h.State(), h.Check())
		case "release":
			out <- fmt.Sprintf("RELEASE %v", h.Release(context.Background()))
		case "exit":
			return 0
		}
	}
	return 0
}

// holderProc is a holder running in a child process.
type holderProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startHolderProc(t *testing.T, endpoints []string, lock string, ttl time.Duration, env ...string) *holderProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), "CONTROLLER_TEST_HELPER=hold",
		"HELPER_ETCD="+strings.Join(endpoints, ","), "HELPER_LOCK="+lock, "HELPER_TTL="+ttl.String())
	cmd.Env = append(cmd.Env, env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	p := &holderProc{t: t, cmd: cmd, done: make(chan struct{})}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start holder process: %v", err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// waitLine waits for an output line starting with prefix and returns it.
func (p *holderProc) waitLine(d time.Duration, prefix string) string {
	p.t.Helper()
	var got string
	testkit.Eventually(p.t, d, "holder process line "+prefix, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.lines {
			if strings.HasPrefix(l, prefix) {
				got = l
				return true
			}
		}
		return false
	})
	return got
}

func (p *holderProc) output() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

func (p *holderProc) send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatalf("holder process stdin: %v", err)
	}
}

func (p *holderProc) fence() int64 {
	p.t.Helper()
	l := p.waitLine(15*time.Second, "FENCE ")
	f, err := strconv.ParseInt(strings.TrimPrefix(l, "FENCE "), 10, 64)
	if err != nil {
		p.t.Fatalf("bad fence line %q", l)
	}
	return f
}

// stop freezes the process with SIGSTOP and waits until the kernel reports
// it stopped: kill(2) returns before a running process has actually
// stopped, and a few milliseconds are enough for it to act.
func (p *holderProc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		p.t.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	testkit.Eventually(p.t, 5*time.Second, "process stopped", func() bool {
		b, err := os.ReadFile(stat)
		if err != nil {
			return false
		}
		// The state follows the parenthesised command name.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return i > 0 && i+2 < len(s) && (s[i+2] == 'T' || s[i+2] == 't')
	})
}

package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHostilePlugins: every way a plugin can fail is an error from
// Evaluate (the agent rejects policy_error), the instance is thrown away
// and replaced, and the next call on the same device works.
func TestHostilePlugins(t *testing.T) {
	const deadline = 100 * time.Millisecond
	cases := []struct {
		plugin  string
		want    error
		mention string // in the error text
		// recovers: the plugin answers action "ok"; the next call is shown to work
		recovers bool
		slow     bool // needs the deadline to stop it
		deadline time.Duration
		or       error // also acceptable
	}{
		{plugin: "goloop", want: ErrTimeout, recovers: true, slow: true},
		{plugin: "loop", want: ErrTimeout, slow: true},
		{plugin: "gosleep", want: ErrTimeout, recovers: true, slow: true},
		// Filling 64 MiB, one memory.grow at a time, takes a while on a
		// loaded machine: these get a longer deadline.
		{plugin: "gomembomb", want: ErrMemoryLimit, recovers: true, deadline: 10 * time.Second},
		{plugin: "memgrow", want: ErrMemoryLimit, deadline: 10 * time.Second},
		{plugin: "gopanic", want: ErrPluginError, mention: "returned -2", recovers: true},
		{plugin: "goexit", want: ErrExit, mention: "exit code 3", recovers: true},
		{plugin: "trap", want: ErrTrap, mention: "unreachable"},
		// Whichever comes first: the stack limit or the deadline.
		{plugin: "recurse", want: ErrTrap, or: ErrTimeout},
		{plugin: "garbage", want: ErrBadOutput, mention: "not a JSON object"},
		{plugin: "huge", want: ErrOutputTooLarge, mention: "100000 bytes"},
		{plugin: "outside", want: ErrBadOutput, mention: "outside memory"},
		{plugin: "negative", want: ErrPluginError, mention: "returned -5"},
	}
	for _, c := range cases {
		t.Run(c.plugin, func(t *testing.T) {
			t.Parallel()
			dl := deadline
			if c.deadline != 0 {
				dl = c.deadline
			}
			h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{Timeout: dl}})
			h.bind(t, "dev", c.plugin, "")
			h.start(t)
			for round := 0; round < 2; round++ {
				start := time.Now()
				_, err := h.Evaluate(context.Background(), "dev", cmd("dev", "set", `{"rpm":1}`))
				took := time.Since(start)
				var ee *EvalError
				if !errors.As(err, &ee) || !(errors.Is(err, c.want) || c.or != nil && errors.Is(err, c.or)) {
					t.Fatalf("round %d: Evaluate = %v, want an *EvalError wrapping %v", round, err, c.want)
				}
				if ee.Device != "dev" || ee.Plugin != c.plugin {
					t.Fatalf("EvalError names %s/%s", ee.Device, ee.Plugin)
				}
				if c.mention != "" {
					mustContain(t, err.Error(), c.mention)
				}
				// Within the deadline, plus slack for a loaded CI machine.
				if c.slow && (took < deadline || took > deadline+time.Second) {
					t.Fatalf("round %d: stopped after %v, deadline %v", round, took, deadline)
				}
				if c.recovers {
					d, err := h.Evaluate(context.Background(), "dev", cmd("dev", "ok", ""))
					if err != nil || !d.Allow {
						t.Fatalf("round %d: the call after the failure = %+v, %v", round, d, err)
					}
				}
			}
			if got := h.counter(t, h.m.replaced, c.plugin); got != 2 {
				t.Errorf("instances replaced = %v, want 2", got)
			}
			if got := h.counter(t, h.m.evals, c.plugin, "error"); got != 2 {
				t.Errorf("error evaluations = %v, want 2", got)
			}
			mustContain(t, h.logs.String(), "plugin failed")
		})
	}
}

// TestMemoryBombStoppedAtCap: the guest never gets more than its limit.
func TestMemoryBombStoppedAtCap(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{Memory: 16 << 20}})
	h.bind(t, "dev", "gomembomb", "")
	h.start(t)
	var grew uint32
	p := h.table.Load().pools["dev"]
	p.enter()
	inst, err := p.get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, fault, err := inst.evaluate(context.Background(), &Input{Device: DeviceRef{ID: "dev"}, Command: CommandView{Action: "set"}}, &p.lim)
	grew = inst.mem.Size()
	p.discard(inst)
	p.exit()
	if !fault || !errors.Is(err, ErrMemoryLimit) {
		t.Fatalf("evaluate = %v (fault %v), want ErrMemoryLimit", err, fault)
	}
	if grew > 16<<20 {
		t.Fatalf("guest memory reached %d bytes, cap %d", grew, 16<<20)
	}
	if grew < 12<<20 {
		t.Fatalf("guest memory only %d bytes: did it really fill its cap?", grew)
	}
}

// TestRunawayDoesNotStallTheProcess: a guest spinning in native code must
// not hold up the Go runtime's stop-the-world (GC), or the timer that
// stops it could never run and the whole agent would hang. Forces GCs
// while runaway calls run, with GOMAXPROCS 1 and 2.
func TestRunawayDoesNotStallTheProcess(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run("GOMAXPROCS="+string(rune('0'+procs)), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			const deadline = 50 * time.Millisecond
			h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{Timeout: deadline}})
			h.bind(t, "go", "goloop", "")
			h.bind(t, "wat", "loop", "")
			h.start(t)
			stop := make(chan struct{})
			var gcs sync.WaitGroup
			gcs.Add(1)
			go func() {
				defer gcs.Done()
				for {
					select {
					case <-stop:
						return
					default:
						runtime.GC()
					}
				}
			}()
			var wg sync.WaitGroup
			for _, dev := range []string{"go", "wat", "go", "wat"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					_, err := h.Evaluate(context.Background(), dev, cmd(dev, "set", ""))
					if !errors.Is(err, ErrTimeout) {
						t.Errorf("%s: %v, want ErrTimeout", dev, err)
					}
					if took := time.Since(start); took > deadline+2*time.Second {
						t.Errorf("%s: stopped after %v", dev, took)
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("runaway calls were not stopped: the process is stalled")
			}
			close(stop)
			gcs.Wait()
		})
	}
}

// TestCancelInterrupts: canceling the caller's context stops a runaway
// call before its deadline; it is not counted against the plugin.
func TestCancelInterrupts(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{Timeout: 10 * time.Second}})
	h.bind(t, "dev", "loop", "")
	h.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := h.Evaluate(ctx, "dev", cmd("dev", "set", ""))
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Evaluate = %v, want ErrTimeout and the context's error", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %v", took)
	}
	if got := h.counter(t, h.m.failures, "loop", "timeout"); got != 0 {
		t.Fatalf("a canceled call was counted as a plugin failure")
	}
}

// TestKeepsFailingIsReported: FailureThreshold failures in a row raise the
// edge_policy_failing gauge and log an error; a success clears it.
func TestKeepsFailingIsReported(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), FailureThreshold: 3})
	h.bind(t, "dev", "gopanic", "")
	h.start(t)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if _, err := h.Evaluate(ctx, "dev", cmd("dev", "set", "")); err == nil {
			t.Fatal("gopanic did not fail")
		}
	}
	failing := h.m.failing.WithLabelValues("gopanic")
	if v := gaugeValue(failing); v != 1 {
		t.Fatalf("edge_policy_failing = %v after 3 failures", v)
	}
	mustContain(t, h.logs.String(), "plugin keeps failing")
	if _, err := h.Evaluate(ctx, "dev", cmd("dev", "ok", "")); err != nil {
		t.Fatal(err)
	}
	if v := gaugeValue(failing); v != 0 {
		t.Fatalf("edge_policy_failing = %v after a success", v)
	}
	mustContain(t, h.logs.String(), "plugin recovered")
	mustContain(t, h.logs.String(), "Decide panicked: boom") // the SDK's log line, through edge.log
}

// TestLoadErrors: a plugin that cannot be loaded fails Start with a
// *LoadError naming the file, and the export or the reason.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	notWasm := filepath.Join(dir, "not.wasm")
	os.WriteFile(notWasm, []byte("\x00asm\x01\x00\x00\x00garbage"), 0o644)
	cases := []struct {
		name   string
		path   string
		want   error
		export string
		text   string
	}{
		{name: "missing file", path: filepath.Join(dir, "nope.wasm"), want: ErrRead, text: "no such file"},
		{name: "not wasm", path: notWasm, want: ErrInvalidModule},
		{name: "no_eval", want: ErrMissingExport, export: "policy_eval", text: "not exported"},
		{name: "eval_i32", want: ErrMissingExport, export: "policy_eval", text: "want [i32] -> [i64]"},
		{name: "abi_v2", want: ErrABIVersion, export: "policy_abi_version", text: "2, want 1"},
		{name: "bad_import", want: ErrImport, text: "env.launch_missiles"},
		{name: "big_memory", want: ErrInit, text: "2048 pages"},
		{name: "start_loop", want: ErrTimeout},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.path
			if path == "" {
				path = pluginPath(t, c.name)
			}
			h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{InitTimeout: 100 * time.Millisecond}})
			if err := h.Bind("dev", Binding{Path: path}); err != nil {
				t.Fatal(err)
			}
			err := h.Start(context.Background())
			var le *LoadError
			if !errors.As(err, &le) || !errors.Is(err, c.want) {
				t.Fatalf("Start = %v, want a *LoadError wrapping %v", err, c.want)
			}
			if le.Path != path || le.Export != c.export {
				t.Fatalf("LoadError path %q export %q", le.Path, le.Export)
			}
			mustContain(t, err.Error(), path)
			if c.text != "" {
				mustContain(t, err.Error(), c.text)
			}
		})
	}
}

// TestBadOutputShapes: the host accepts exactly the output shape of the
// ABI. echo.wat answers with its config.
func TestBadOutputShapes(t *testing.T) {
	cases := []struct {
		out    string
		want   Decision
		errSub string
	}{
		{out: `{"allow":true}`, want: Decision{Allow: true}},
		{out: ` { "allow" : false , "reason" : "too \"hot\"" } `, want: Decision{Reason: `too "hot"`}},
		{out: `{"reason":"r","allow":false}`, want: Decision{Reason: "r"}},
		{out: `{"allow":true,"params":{"rpm":3000,"a":[1,2]}}`, want: Decision{Allow: true, Params: []byte(`{"rpm":3000,"a":[1,2]}`)}},
		{out: `{"allow":"yes"}`, errSub: `"allow" is not a boolean`},
		{out: `{"allow":1}`, errSub: `"allow" is not a boolean`},
		{out: `{"reason":"no allow"}`, errSub: `no "allow"`},
		{out: `{"allow":true,"params":[1]}`, errSub: `"params" is not an object`},
		{out: `{"allow":true,"params":null}`, errSub: `"params" is not an object`},
		{out: `{"allow":false,"reason":7}`, errSub: `"reason" is not a string`},
		{out: `{"allow":true,"extra":1}`, errSub: `unexpected key "extra"`},
		{out: `{"allow":true,"allow":false}`, errSub: `duplicate key "allow"`},
		{out: `{"allow":false,"params":{"a":1}}`, errSub: `"params" on a denial`},
		{out: `[true]`, errSub: "not a JSON object"},
	}
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t)})
	for i, c := range cases {
		h.bind(t, "dev"+string(rune('a'+i)), "echo", c.out)
	}
	h.start(t)
	for i, c := range cases {
		t.Run(c.out, func(t *testing.T) {
			dev := "dev" + string(rune('a'+i))
			d, err := h.Evaluate(context.Background(), dev, cmd(dev, "set", ""))
			if c.errSub != "" {
				if !errors.Is(err, ErrBadOutput) {
					t.Fatalf("Evaluate = %+v, %v; want ErrBadOutput", d, err)
				}
				mustContain(t, err.Error(), c.errSub)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Allow != c.want.Allow || d.Reason != c.want.Reason || string(d.Params) != string(c.want.Params) {
				t.Fatalf("got %+v, want %+v", d, c.want)
			}
		})
	}
}

// TestInputErrors: an input the host cannot send is an error, but not the
// plugin's fault: its instance is kept.
func TestInputErrors(t *testing.T) {
	h := newTestHost(t, HostOptions{CacheDir: sharedCache(t), Defaults: Limits{MaxInput: 512}})
	h.bind(t, "dev", "range-limit-c", `{"param":"rpm","max":3000}`)
	h.start(t)
	ctx := context.Background()
	_, err := h.Evaluate(ctx, "dev", cmd("dev", "set", `{"rpm":`+strings.Repeat("1", 600)+`}`))
	if !errors.Is(err, ErrInputTooLarge) {
		t.Fatalf("big input: %v", err)
	}
	_, err = h.Evaluate(ctx, "dev", cmd("dev", "set", `{"rpm":1} , "injected": true`))
	if !errors.Is(err, ErrBadInput) {
		t.Fatalf("bad params: %v", err)
	}
	if got := h.counter(t, h.m.replaced, "range-limit-c"); got != 0 {
		t.Fatalf("instances replaced: %v", got)
	}
	if d, err := h.Evaluate(ctx, "dev", cmd("dev", "set", `{"rpm":1}`)); err != nil || !d.Allow {
		t.Fatalf("%+v %v", d, err)
	}
}

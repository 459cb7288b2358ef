package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"
)

// instance is one instantiated plugin. It is not goroutine-safe: a pool
// hands it to one call at a time. After any failure it is closed, never
// reused (its memory and the Go runtime inside may be in any state, and
// its interrupt global may be set).
type instance struct {
	eng       *engine
	mod       api.Module
	mem       api.Memory
	eval      api.Function
	buffer    api.Function
	interrupt api.MutableGlobal
	sink      *sink
	stdio     *lineWriter

	bufPtr uint32 // the guest buffer, reused while large enough (ABI: valid until the next policy_buffer)
	bufCap uint32
	memCap uint64 // bytes
	enc    []byte // input encoding scratch
	stack  [1]uint64

	// Deadline machinery (see arm). state: armIdle, armRunning, or the
	// reason the call was interrupted.
	state   atomic.Uint32
	timer   *time.Timer
	stopCtx func() bool
	cancel  context.CancelFunc // closeOnDone mode only
}

// benchNoDeadline turns every deadline off: no interrupt checks in the
// guest, no timer. Only the benchmarks set it, to measure what the
// deadline costs; nothing stops a runaway plugin then.
var benchNoDeadline bool

const (
	armIdle uint32 = iota
	armRunning
	armTimeout
	armCanceled
)

// minBuffer is the smallest buffer the host asks for, so that one
// policy_buffer call serves many inputs.
const minBuffer = 4096

// newInstance instantiates p and runs its start function, _initialize,
// policy_abi_version and policy_init(config), all within initTimeout.
func (e *engine) newInstance(ctx context.Context, p *plugin, config []byte, s *sink, lim Limits) (*instance, error) {
	inst := &instance{eng: e, sink: s, memCap: uint64(lim.pages()) * pageSize}
	inst.stdio = &lineWriter{sink: s}
	mc := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions().
		WithSysWalltime().
		WithSysNanotime().
		// A policy has no reason to sleep; a guest that tries spins until
		// its deadline instead of blocking in the host, where no interrupt
		// could reach it.
		WithNanosleep(func(int64) {}).
		WithRandSource(randReader).
		WithStdout(inst.stdio).
		WithStderr(inst.stdio)
	mod, err := e.rt.InstantiateModule(experimental.WithMemoryAllocator(ctx, e.alloc), p.compiled, mc)
	if err != nil {
		if strings.Contains(err.Error(), "import") {
			return nil, fmt.Errorf("%w: %w", ErrImport, err)
		}
		return nil, fmt.Errorf("%w: %w", ErrInit, err)
	}
	inst.mod = mod
	e.sinks.Store(mod, s)
	inst.mem = mod.ExportedMemory("memory")
	inst.eval = mod.ExportedFunction("policy_eval")
	inst.buffer = mod.ExportedFunction("policy_buffer")
	g, ok := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
	if !ok {
		inst.close()
		return nil, fmt.Errorf("%w: interrupt global missing", ErrInit)
	}
	inst.interrupt = g
	inst.timer = time.AfterFunc(math.MaxInt64, inst.fire)
	inst.timer.Stop()

	cctx := inst.arm(ctx, lim.InitTimeout)
	if err := inst.initialize(cctx, p, config); err != nil {
		inst.disarm()
		inst.close()
		return nil, err
	}
	if inst.disarm() != armIdle {
		inst.close()
		return nil, fmt.Errorf("initialisation: %w: %w", ErrInit, ErrTimeout)
	}
	return inst, nil
}

func (inst *instance) initialize(cctx context.Context, p *plugin, config []byte) error {
	mod := inst.mod
	fail := func(what string, err error) error {
		return fmt.Errorf("%s: %w", what, err)
	}
	if p.hasStart {
		if err := inst.call(cctx, mod.ExportedFunction(startExport), nil); err != nil {
			return fail("start function", fmt.Errorf("%w: %w", ErrInit, err))
		}
	}
	if p.hasReact {
		if err := inst.call(cctx, mod.ExportedFunction("_initialize"), nil); err != nil {
			return fail("_initialize", fmt.Errorf("%w: %w", ErrInit, err))
		}
	}
	if err := inst.call(cctx, mod.ExportedFunction("policy_abi_version"), nil); err != nil {
		return fail("policy_abi_version", fmt.Errorf("%w: %w", ErrInit, err))
	}
	if v := int32(inst.stack[0]); v != 1 {
		return fail("policy_abi_version", fmt.Errorf("%w: %d, want 1", ErrABIVersion, v))
	}
	if p.hasInit {
		if err := inst.write(cctx, config); err != nil {
			return fail("policy_init", fmt.Errorf("%w: %w", ErrInit, err))
		}
		if err := inst.call(cctx, mod.ExportedFunction("policy_init"), []uint64{uint64(len(config))}); err != nil {
			return fail("policy_init", fmt.Errorf("%w: %w", ErrInit, err))
		}
		if rc := int32(inst.stack[0]); rc != 0 {
			return fail("policy_init", fmt.Errorf("%w: policy_init returned %d", ErrConfigRejected, rc))
		}
	} else if len(config) > 0 && string(config) != "{}" {
		return fail("policy_init", fmt.Errorf("%w: the plugin takes no configuration (no policy_init export)", ErrConfigRejected))
	}
	return nil
}

// arm starts the deadline of one evaluation (one or more guest calls):
// after d, or when ctx is done, the instance's interrupt global is set and
// the guest traps at its next loop head or function entry. It returns the
// context to pass to the calls.
//
// Cost per evaluation: a timer Reset and Stop, plus a context.AfterFunc
// when ctx can be canceled; no goroutine (BENCHMARKS.md ("Policy plugins")).
func (inst *instance) arm(ctx context.Context, d time.Duration) context.Context {
	if benchNoDeadline {
		return ctx
	}
	if inst.eng.closeOnDone {
		cctx, cancel := context.WithTimeout(ctx, d)
		inst.cancel = cancel
		return cctx
	}
	inst.state.Store(armRunning)
	inst.timer.Reset(d)
	if ctx.Done() != nil {
		inst.stopCtx = context.AfterFunc(ctx, inst.onCancel)
	}
	return ctx
}

// disarm ends the deadline; it reports why the evaluation was interrupted
// (armIdle: it was not). An interrupted instance must be closed.
func (inst *instance) disarm() uint32 {
	if benchNoDeadline {
		return armIdle
	}
	if inst.eng.closeOnDone {
		if inst.cancel != nil {
			inst.cancel()
			inst.cancel = nil
		}
		return armIdle
	}
	inst.timer.Stop()
	if inst.stopCtx != nil {
		inst.stopCtx()
		inst.stopCtx = nil
	}
	if inst.state.CompareAndSwap(armRunning, armIdle) {
		return armIdle
	}
	return inst.state.Load()
}

// fire runs on the timer's goroutine. The CAS makes sure the global is set
// at most once per instance, and only while a call is armed.
func (inst *instance) fire() {
	if inst.state.CompareAndSwap(armRunning, armTimeout) {
		inst.interrupt.Set(1)
	}
}

func (inst *instance) onCancel() {
	if inst.state.CompareAndSwap(armRunning, armCanceled) {
		inst.interrupt.Set(1)
	}
}

// call runs fn with args; the first result is left in inst.stack[0].
func (inst *instance) call(ctx context.Context, fn api.Function, args []uint64) error {
	copy(inst.stack[:], args)
	if err := fn.CallWithStack(ctx, inst.stack[:]); err != nil {
		return inst.classify(ctx, err)
	}
	return nil
}

// classify turns a call's error into the package's sentinels.
func (inst *instance) classify(ctx context.Context, err error) error {
	switch inst.state.Load() {
	case armTimeout:
		return ErrTimeout
	case armCanceled:
		return fmt.Errorf("%w (%w)", ErrTimeout, context.Cause(ctx))
	}
	memFull := inst.mem != nil && uint64(inst.mem.Size())+16*pageSize > inst.memCap
	var ee *sys.ExitError
	if errors.As(err, &ee) {
		switch ee.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			return ErrTimeout
		case sys.ExitCodeContextCanceled:
			return fmt.Errorf("%w (%w)", ErrTimeout, context.Canceled)
		}
		if memFull {
			return fmt.Errorf("%w: %w: exit code %d", ErrMemoryLimit, ErrExit, ee.ExitCode())
		}
		return fmt.Errorf("%w: exit code %d", ErrExit, ee.ExitCode())
	}
	msg := err.Error()
	if i := strings.IndexByte(msg, '\n'); i > 0 {
		msg = msg[:i] // drop wazero's stack trace
	}
	if memFull {
		return fmt.Errorf("%w: %w: %s", ErrMemoryLimit, ErrTrap, msg)
	}
	return fmt.Errorf("%w: %s", ErrTrap, msg)
}

// write copies b into the guest's buffer, asking for a bigger one when
// needed.
func (inst *instance) write(ctx context.Context, b []byte) error {
	n := uint32(len(b))
	if n > inst.bufCap || inst.bufPtr == 0 {
		size := n
		if size < minBuffer {
			size = minBuffer
		}
		if err := inst.call(ctx, inst.buffer, []uint64{uint64(size)}); err != nil {
			return err
		}
		ptr := uint32(inst.stack[0])
		if ptr == 0 {
			return fmt.Errorf("%w: policy_buffer(%d) returned 0", ErrPluginError, size)
		}
		if uint64(ptr)+uint64(size) > uint64(inst.mem.Size()) {
			return fmt.Errorf("%w: policy_buffer(%d) returned %d, outside memory", ErrPluginError, size, ptr)
		}
		inst.bufPtr, inst.bufCap = ptr, size
	}
	if !inst.mem.Write(inst.bufPtr, b) {
		return fmt.Errorf("%w: buffer outside memory", ErrPluginError)
	}
	return nil
}

// evaluate runs policy_eval on in. fault reports whether the instance must
// be thrown away (every error but a bad input).
func (inst *instance) evaluate(ctx context.Context, in *Input, lim *Limits) (d Decision, fault bool, err error) {
	enc, err := appendInput(inst.enc[:0], in)
	inst.enc = enc
	if err != nil {
		return Decision{}, false, err
	}
	if len(enc) > lim.MaxInput {
		return Decision{}, false, fmt.Errorf("%w: %d bytes, limit %d", ErrInputTooLarge, len(enc), lim.MaxInput)
	}
	cctx := inst.arm(ctx, lim.Timeout)
	err = inst.write(cctx, enc)
	if err == nil {
		err = inst.call(cctx, inst.eval, []uint64{uint64(len(enc))})
	}
	if why := inst.disarm(); why != armIdle {
		// Interrupted, even if the call returned just in time: the
		// global may be set, so this instance is done.
		if err == nil || !errors.Is(err, ErrTimeout) {
			err = ErrTimeout
		}
		return Decision{}, true, err
	}
	if err != nil {
		return Decision{}, true, err
	}
	res := int64(inst.stack[0])
	if res < 0 {
		return Decision{}, true, fmt.Errorf("%w: policy_eval returned %d", ErrPluginError, res)
	}
	ptr, n := uint32(res>>32), uint32(res)
	if int64(n) > int64(lim.MaxOutput) {
		return Decision{}, true, fmt.Errorf("%w: %d bytes, limit %d", ErrOutputTooLarge, n, lim.MaxOutput)
	}
	out, ok := inst.mem.Read(ptr, n)
	if !ok {
		return Decision{}, true, fmt.Errorf("%w: output [%d, +%d) outside memory", ErrBadOutput, ptr, n)
	}
	d, err = decodeOutput(out)
	if err != nil {
		return Decision{}, true, err
	}
	return d, false, nil
}

func (inst *instance) close() {
	if inst.timer != nil {
		inst.timer.Stop()
	}
	inst.stdio.flush()
	inst.eng.sinks.Delete(inst.mod)
	_ = inst.mod.Close(context.Background())
}

// sink is where a plugin's log lines go: the host's logger, rate-limited
// per sink (one per pool).
type sink struct {
	log    *slog.Logger
	plugin string
	path   string

	mu      sync.Mutex
	window  time.Time
	lines   int
	dropped int
}

// logBurst is how many lines a plugin may log per second; the rest are
// counted and reported.
const logBurst = 20

func (s *sink) emit(level slog.Level, stream, msg string, truncated bool) {
	s.mu.Lock()
	now := time.Now()
	dropped := 0
	if now.Sub(s.window) >= time.Second {
		dropped, s.dropped = s.dropped, 0
		s.window, s.lines = now, 0
	}
	s.lines++
	if s.lines > logBurst {
		s.dropped++
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if dropped > 0 {
		s.log.Warn("policy: plugin log lines dropped", "plugin", s.plugin, "dropped", dropped)
	}
	s.log.Log(context.Background(), level, "policy: plugin says", "plugin", s.plugin, "stream", stream, "msg", msg, "truncated", truncated)
}

// lineWriter turns a guest's stdout/stderr into log lines.
type lineWriter struct {
	sink *sink
	buf  []byte
	skip bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := indexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if !w.skip {
			if room := maxLogLine - len(w.buf); len(chunk) > room {
				w.buf = append(w.buf, chunk[:room]...)
				w.emit(true)
				w.skip = true // drop the rest of this line
			} else {
				w.buf = append(w.buf, chunk...)
			}
		}
		if i < 0 {
			break
		}
		if !w.skip {
			w.emit(false)
		}
		w.skip = false
		p = p[i+1:]
	}
	return n, nil
}

func (w *lineWriter) emit(truncated bool) {
	w.sink.emit(slog.LevelInfo, "stdio", string(w.buf), truncated)
	w.buf = w.buf[:0]
}

// flush emits a partial last line.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 && !w.skip {
		w.emit(false)
	}
	w.buf, w.skip = w.buf[:0], false
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

package policy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

var randReader = rand.Reader

// compileMu serialises compilations in the whole process: concurrent
// compiles that share a compilation cache have had bugs in wazero, and a
// gateway has few cores to spare at start-up anyway.
var compileMu sync.Mutex

// engine is one wazero runtime with the host modules (edge, WASI) and an
// optional on-disk compilation cache. A Host has one; TestOnce makes its own.
type engine struct {
	rt    wazero.Runtime
	cache wazero.CompilationCache // nil without a cache dir
	log   *slog.Logger
	// closeOnDone: this platform runs wazero's interpreter, where the
	// injected interrupt check would be a data race between Go code (see
	// instrument.go): fall back to WithCloseOnContextDone and a context
	// deadline per call.
	closeOnDone bool
	wasi        map[string]api.FunctionDefinition
	sinks       sync.Map // api.Module -> *sink, for edge.log
	// alloc backs guest memories (memory_unix.go); nil: wazero's own.
	alloc experimental.MemoryAllocator
}

// compilerSupported mirrors wazero's own choice of its optimizing compiler
// (internal/platform.CompilerSupported): amd64 and arm64 on the usual OSes.
func compilerSupported() bool {
	switch runtime.GOOS {
	case "linux", "darwin", "freebsd", "netbsd", "windows":
		return runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64"
	case "dragonfly", "solaris", "illumos":
		return runtime.GOARCH == "amd64"
	}
	return false
}

func newEngine(ctx context.Context, cacheDir string, log *slog.Logger, forceCloseOnDone bool) (*engine, error) {
	e := &engine{log: log, alloc: memoryAllocator()}
	var cfg wazero.RuntimeConfig
	if compilerSupported() && !forceCloseOnDone {
		cfg = wazero.NewRuntimeConfigCompiler()
	} else {
		cfg = wazero.NewRuntimeConfig().WithCloseOnContextDone(true)
		e.closeOnDone = true
	}
	if cacheDir != "" {
		if err := os.MkdirAll(cacheDir, 0o755); err != nil {
			return nil, fmt.Errorf("policy: compilation cache: %w", err)
		}
		c, err := wazero.NewCompilationCacheWithDir(cacheDir)
		if err != nil {
			return nil, fmt.Errorf("policy: compilation cache %s: %w", cacheDir, err)
		}
		e.cache = c
		cfg = cfg.WithCompilationCache(c)
	}
	e.rt = wazero.NewRuntimeWithConfig(ctx, cfg)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, e.rt); err != nil {
		e.close(ctx)
		return nil, fmt.Errorf("policy: WASI: %w", err)
	}
	e.wasi = e.rt.Module(wasi_snapshot_preview1.ModuleName).ExportedFunctionDefinitions()
	_, err := e.rt.NewHostModuleBuilder("edge").
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(e.hostLog), []api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, nil).
		WithParameterNames("level", "ptr", "len").
		Export("log").
		Instantiate(ctx)
	if err != nil {
		e.close(ctx)
		return nil, fmt.Errorf("policy: edge host module: %w", err)
	}
	return e, nil
}

func (e *engine) close(ctx context.Context) {
	_ = e.rt.Close(ctx)
	if e.cache != nil {
		_ = e.cache.Close(ctx)
	}
}

// maxLogLine truncates what a guest logs (edge.log, stdout, stderr).
const maxLogLine = 512

// hostLog implements edge.log(level, ptr, len).
func (e *engine) hostLog(ctx context.Context, mod api.Module, stack []uint64) {
	level, ptr, n := int32(stack[0]), uint32(stack[1]), uint32(stack[2])
	v, ok := e.sinks.Load(mod)
	if !ok {
		return
	}
	truncated := false
	if n > maxLogLine {
		n, truncated = maxLogLine, true
	}
	msg, ok := mod.Memory().Read(ptr, n)
	if !ok {
		return
	}
	lvl := slog.LevelDebug
	switch level {
	case 1:
		lvl = slog.LevelInfo
	case 2:
		lvl = slog.LevelWarn
	case 3:
		lvl = slog.LevelError
	}
	v.(*sink).emit(lvl, "log", string(msg), truncated)
}

// plugin is one compiled plugin file (at one memory cap).
type plugin struct {
	key      pluginKey
	name     string
	digest   [32]byte
	compiled wazero.CompiledModule
	hasStart bool // the start section, exported as startExport
	hasInit  bool // policy_init
	hasReact bool // _initialize
	took     time.Duration

	mu   sync.Mutex
	refs int // pools using it, plus one while it is the current version
	eng  *engine
}

type pluginKey struct {
	path  string
	pages uint32
}

func (p *plugin) ref() {
	p.mu.Lock()
	p.refs++
	p.mu.Unlock()
}

// unref drops a reference; the last one closes the compiled code.
func (p *plugin) unref() {
	p.mu.Lock()
	p.refs--
	last := p.refs == 0
	p.mu.Unlock()
	if last {
		_ = p.compiled.Close(context.Background())
	}
}

// signature of an export: params and results.
type signature struct {
	params, results []api.ValueType
}

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

var requiredExports = []struct {
	name string
	sig  signature
}{
	{"policy_abi_version", signature{nil, []api.ValueType{i32}}},
	{"policy_buffer", signature{[]api.ValueType{i32}, []api.ValueType{i32}}},
	{"policy_eval", signature{[]api.ValueType{i32}, []api.ValueType{i64}}},
}

var optionalExports = []struct {
	name string
	sig  signature
}{
	{"_initialize", signature{nil, nil}},
	{"policy_init", signature{[]api.ValueType{i32}, []api.ValueType{i32}}},
}

func sameSig(def api.FunctionDefinition, s signature) bool {
	return slices.Equal(def.ParamTypes(), s.params) && slices.Equal(def.ResultTypes(), s.results)
}

// compile instruments and compiles one plugin file's bytes, and checks its
// exports and imports. It does not run it.
func (e *engine) compile(ctx context.Context, name, path string, bin []byte, pages uint32) (*plugin, error) {
	p := &plugin{key: pluginKey{path, pages}, name: name, digest: sha256.Sum256(bin), eng: e, refs: 0}
	ins, err := instrument(bin, pages)
	if err != nil {
		if errors.Is(err, ErrMemoryLimit) {
			return nil, loadErr(name, path, nil, "", fmt.Errorf("%w: %w", ErrInit, err))
		}
		return nil, loadErr(name, path, nil, "", fmt.Errorf("%w: %w", ErrInvalidModule, err))
	}
	p.hasStart = ins.hasStart
	start := time.Now()
	compileMu.Lock()
	cm, err := e.rt.CompileModule(ctx, ins.binary)
	// Compiling a Go plugin leaves tens of MiB of the compiler's garbage;
	// giving it back before the next plugin compiles keeps the cold
	// start's peak RSS (VmHWM, which stays) near the steady state: 127-144
	// -> 113 MiB with the five example Go plugins, for about 10 ms per
	// plugin on a warm start (BENCHMARKS.md, "footprint").
	debug.FreeOSMemory()
	compileMu.Unlock()
	p.took = time.Since(start)
	if err != nil {
		return nil, loadErr(name, path, nil, "", fmt.Errorf("%w: %w", ErrInvalidModule, err))
	}
	fail := func(export string, err error) (*plugin, error) {
		_ = cm.Close(ctx)
		return nil, loadErr(name, path, nil, export, err)
	}
	if _, ok := cm.ExportedMemories()["memory"]; !ok {
		return fail("memory", fmt.Errorf("%w: no exported memory named \"memory\"", ErrMissingExport))
	}
	fns := cm.ExportedFunctions()
	for _, x := range requiredExports {
		def, ok := fns[x.name]
		if !ok {
			return fail(x.name, fmt.Errorf("%w: not exported", ErrMissingExport))
		}
		if !sameSig(def, x.sig) {
			return fail(x.name, fmt.Errorf("%w: signature %v -> %v, want %v -> %v", ErrMissingExport,
				typeNames(def.ParamTypes()), typeNames(def.ResultTypes()), typeNames(x.sig.params), typeNames(x.sig.results)))
		}
	}
	for _, x := range optionalExports {
		def, ok := fns[x.name]
		if !ok {
			continue
		}
		if !sameSig(def, x.sig) {
			return fail(x.name, fmt.Errorf("%w: signature %v -> %v, want %v -> %v", ErrMissingExport,
				typeNames(def.ParamTypes()), typeNames(def.ResultTypes()), typeNames(x.sig.params), typeNames(x.sig.results)))
		}
		switch x.name {
		case "_initialize":
			p.hasReact = true
		case "policy_init":
			p.hasInit = true
		}
	}
	for _, imp := range cm.ImportedFunctions() {
		mod, fn, _ := imp.Import()
		ok := false
		switch mod {
		case "edge":
			ok = fn == "log" && sameSig(imp, signature{[]api.ValueType{i32, i32, i32}, nil})
		case wasi_snapshot_preview1.ModuleName:
			if def, found := e.wasi[fn]; found {
				ok = slices.Equal(def.ParamTypes(), imp.ParamTypes()) && slices.Equal(def.ResultTypes(), imp.ResultTypes())
			}
		}
		if !ok {
			return fail("", fmt.Errorf("%w: %s.%s", ErrImport, mod, fn))
		}
	}
	p.compiled = cm
	return p, nil
}

func typeNames(ts []api.ValueType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = api.ValueTypeName(t)
	}
	return out
}

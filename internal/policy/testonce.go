package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// TestDevice is the device ID TestOnce uses when the command names none.
const TestDevice = "test-device"

// TestOnce runs one plugin on one command, for `edge-agent policy test`:
// it loads wasmPath (compiling it, with no disk cache), runs policy_init
// with config (nil or empty: {}), and evaluates command against state
// (nil or empty: {}) with the ABI's default limits.
//
// command is either a Command as a controller sends it (op_id, fence,
// action, params, holder; optionally "device" and "device_type" to name the
// device, else TestDevice), or a whole input document as docs/plugin-abi.md
// shows it (an object with a "command" member), which allows a group view;
// a non-empty state replaces the document's. The returned duration is that
// of the evaluation alone.
//
// A plugin that cannot be loaded or rejects config returns a *LoadError;
// a plugin that fails to decide, an *EvalError (the agent would reject the
// command policy_error); malformed command or state JSON, a plain error.
// What the plugin logs goes to log (nil: discarded).
func TestOnce(ctx context.Context, wasmPath string, command, state, config []byte) (Decision, time.Duration, error) {
	return testOnce(ctx, wasmPath, command, state, config, "", nil)
}

// TestOnceLogged is TestOnce with the plugin's log lines (its own
// reasons for failing, from sdk.Log or its stdout/stderr) going to log as
// records with the message "policy: plugin says" and the keys plugin,
// stream, msg and truncated.
func TestOnceLogged(ctx context.Context, wasmPath string, command, state, config []byte, log *slog.Logger) (Decision, time.Duration, error) {
	return testOnce(ctx, wasmPath, command, state, config, "", log)
}

func testOnce(ctx context.Context, wasmPath string, command, state, config []byte, cacheDir string, log *slog.Logger) (Decision, time.Duration, error) {
	in, err := testInput(command, state)
	if err != nil {
		return Decision{}, 0, err
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	h := NewHost(HostOptions{Logger: log, CacheDir: cacheDir})
	defer h.Close(context.Background())
	if err := h.Bind(in.Device.ID, Binding{Path: wasmPath, Config: config}); err != nil {
		return Decision{}, 0, err
	}
	if err := h.Start(ctx); err != nil {
		return Decision{}, 0, err
	}
	start := time.Now()
	d, err := h.Evaluate(ctx, in.Device.ID, in)
	return d, time.Since(start), err
}

func testInput(command, state []byte) (Input, error) {
	var in Input
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(command, &probe); err != nil {
		return in, fmt.Errorf("policy: command: %w", err)
	}
	if _, whole := probe["command"]; whole {
		dec := json.NewDecoder(bytes.NewReader(command))
		if err := dec.Decode(&in); err != nil {
			return in, fmt.Errorf("policy: input document: %w", err)
		}
	} else {
		var c struct {
			V          int             `json:"v"`
			OpID       string          `json:"op_id"`
			Fence      int64           `json:"fence"`
			Action     string          `json:"action"`
			Params     json.RawMessage `json:"params"`
			Lock       string          `json:"lock"`
			Holder     string          `json:"holder"`
			ReplyTo    string          `json:"reply_to"`
			ExpiresAt  *time.Time      `json:"expires_at"`
			Device     string          `json:"device"`
			DeviceType string          `json:"device_type"`
		}
		dec := json.NewDecoder(bytes.NewReader(command))
		if err := dec.Decode(&c); err != nil {
			return in, fmt.Errorf("policy: command: %w", err)
		}
		in.Command = CommandView{OpID: c.OpID, Fence: c.Fence, Action: c.Action, Params: c.Params, Holder: c.Holder}
		in.Device = DeviceRef{ID: c.Device, Type: c.DeviceType}
		if c.Fence > 0 {
			in.LastFence = c.Fence - 1
		}
	}
	if in.Device.ID == "" {
		in.Device.ID = TestDevice
	}
	if len(bytes.TrimSpace(state)) > 0 {
		if !json.Valid(state) {
			return in, fmt.Errorf("policy: state is not valid JSON")
		}
		in.State = json.RawMessage(state)
	}
	if in.Now.IsZero() {
		in.Now = time.Now().UTC()
	}
	return in, nil
}

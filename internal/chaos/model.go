package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// The porcupine model: one device as a fenced register with at-most-once
// operations. Its state is (last_fence, the device's value); an operation
// is one op_id, from its first invocation to its first final recorded
// Result (docs/protocol.md, "What is recorded"), with what the firmware's
// journal says reached the hardware folded into its input:
//
//   - applied/ok needs fence >= last_fence and exactly one journal entry;
//     it sets last_fence and the value, and its Result must show both
//     (last_fence, output);
//   - a barrier (action fence) applied/ok needs fence >= last_fence and
//     raises it;
//   - stale_fence needs fence < last_fence and changes nothing;
//   - device_error and not_applied passed the fence check (the pending
//     record raised last_fence) and leave the value;
//   - expired raised last_fence or not (judged before the fence check, or
//     after a write that was not applied); lock_mismatch changes nothing;
//   - an operation with no final recorded Result is open: it may have had
//     no effect or passed the fence check (raised last_fence); if the
//     journal has it, it was applied (and had to pass the fence check);
//   - a fence floor (the agent's, after its store lost its memory) raises
//     last_fence to the floor if it is below;
//   - anything applied twice, or a code outside this list, is illegal.
//
// An operation the journal has is pinned to the instant the firmware
// applied it (the agent works one command of a device at a time, so the
// write's effect, its fence check and its outcome all happen within that
// command's turn): the journal's order is the hardware's truth.

type devState struct {
	lf  int64
	val string // canonical JSON
}

type opIn struct {
	id      string
	fence   int64
	barrier bool
	typ     string // device type
	action  string
	params  json.RawMessage
	applied int  // journal entries of this op
	floor   bool // a fence floor the agent took: last_fence = max(last_fence, fence)
}

type opOut struct {
	open    bool
	code    wire.Code
	lf      int64
	lfKnown bool   // false when only a replay (duplicate: true, last_fence as it is now) was seen
	output  string // canonical JSON of the Result's output
}

func fenceModel(typ string) porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{devState{val: initialValue(typ)}} },
		Step: func(st, in, out interface{}) []interface{} {
			var next []interface{}
			for _, n := range stepFence(st.(devState), in.(opIn), out.(opOut)) {
				next = append(next, n)
			}
			return next
		},
		Equal: func(a, b interface{}) bool { return a.(devState) == b.(devState) },
		Hash: func(s interface{}) uint64 {
			d := s.(devState)
			h := fnv.New64a()
			fmt.Fprintf(h, "%d|%s", d.lf, d.val)
			return h.Sum64()
		},
		DescribeOperation: func(in, out interface{}) string {
			i, o := in.(opIn), out.(opOut)
			res := "open"
			if !o.open {
				res = fmt.Sprintf("%s lf=%d %s", o.code, o.lf, o.output)
			}
			return fmt.Sprintf("%s f=%d %s %s (journal %d) -> %s", i.id, i.fence, i.action, shortJSON(i.params), i.applied, res)
		},
		DescribeState: func(s interface{}) string {
			d := s.(devState)
			return fmt.Sprintf("lf=%d %s", d.lf, d.val)
		},
	}
	return nm.ToModel()
}

// stepFence is the model's sequential specification: the states the device
// can be in after op in state s, given what was observed (out).
func stepFence(s devState, in opIn, out opOut) []devState {
	if in.floor {
		s.lf = max(s.lf, in.fence)
		return []devState{s}
	}
	if in.applied > 1 {
		return nil // at most once
	}
	passes := in.fence >= s.lf
	raised := s
	if passes {
		raised.lf = in.fence
	}
	shows := func(n devState) bool { return !out.lfKnown || out.lf == n.lf }
	if out.open {
		switch {
		case in.barrier:
			return uniqStates(s, raised)
		case in.applied == 1:
			if !passes {
				return nil
			}
			n, ok := applyValue(in.typ, raised, in.action, in.params)
			if !ok {
				return nil
			}
			return []devState{n}
		}
		return uniqStates(s, raised)
	}
	switch out.code {
	case wire.CodeOK:
		if !passes {
			return nil
		}
		if in.barrier {
			if in.applied > 0 || !shows(raised) {
				return nil
			}
			return []devState{raised}
		}
		if in.applied != 1 {
			return nil
		}
		n, ok := applyValue(in.typ, raised, in.action, in.params)
		if !ok || !shows(n) || out.output != n.val {
			return nil
		}
		return []devState{n}
	case wire.CodeStaleFence:
		if passes || in.applied > 0 || !shows(s) {
			return nil
		}
		return []devState{s}
	case wire.CodeDeviceError, wire.CodeNotApplied, wire.CodePolicyDenied:
		if !passes || in.applied > 0 || !shows(raised) {
			return nil
		}
		return []devState{raised}
	case wire.CodeDeviceUnreachable, wire.CodePolicyError:
		// Recorded and final (final means final), and nothing was written:
		// the fence passed, and last_fence may or may not have been raised
		// (a policy error ends before the pending record, an unreachable
		// device after it).
		if !passes || in.applied > 0 {
			return nil
		}
		var out2 []devState
		for _, n := range uniqStates(s, raised) {
			if shows(n) {
				out2 = append(out2, n)
			}
		}
		return out2
	case wire.CodeExpired, wire.CodeLockMismatch:
		if in.applied > 0 {
			return nil
		}
		var out2 []devState
		for _, n := range uniqStates(s, raised) {
			if shows(n) && (out.code == wire.CodeExpired || n == s) {
				out2 = append(out2, n)
			}
		}
		return out2
	}
	return nil
}

func uniqStates(a, b devState) []devState {
	if a == b {
		return []devState{a}
	}
	return []devState{a, b}
}

func initialValue(typ string) string {
	switch typ {
	case "pump":
		return `{"rpm":0}`
	case "valve":
		return `{"open":0}`
	case "relay":
		return `{"on":false}`
	}
	return `{}`
}

// applyValue is the hardware of firmware-sim (docs/protocol.md §2): the
// device's value after action; false when the hardware refuses it.
func applyValue(typ string, s devState, action string, params json.RawMessage) (devState, bool) {
	p := map[string]any{}
	if len(bytes.TrimSpace(params)) > 0 && string(params) != "null" {
		if err := json.Unmarshal(params, &p); err != nil {
			return s, false
		}
	}
	cur := map[string]any{}
	_ = json.Unmarshal([]byte(s.val), &cur)
	num := func(k string, lo, hi float64) (float64, bool) {
		v, ok := p[k].(float64)
		return v, ok && len(p) == 1 && v >= lo && v <= hi && v == float64(int64(v))
	}
	var next map[string]any
	switch typ {
	case "pump", "valve":
		param, reset, hi := "rpm", "stop", 6000.0
		if typ == "valve" {
			param, reset, hi = "open", "close", 100
		}
		switch action {
		case "set":
			v, ok := num(param, 0, hi)
			if !ok {
				return s, false
			}
			next = map[string]any{param: v}
		case reset:
			if len(p) != 0 {
				return s, false
			}
			next = map[string]any{param: 0}
		default:
			return s, false
		}
	case "relay":
		switch action {
		case "set":
			on, ok := p["on"].(bool)
			if !ok || len(p) != 1 {
				return s, false
			}
			next = map[string]any{"on": on}
		case "toggle":
			if len(p) != 0 {
				return s, false
			}
			on, _ := cur["on"].(bool)
			next = map[string]any{"on": !on}
		default:
			return s, false
		}
	default:
		next = cur
		for k, v := range p {
			next[k] = v
		}
	}
	s.val = canonical(next)
	return s, true
}

// canonical renders a JSON value with sorted keys and plain numbers.
func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(b)
}

// canonicalJSON re-renders raw JSON canonically ("" for none).
func canonicalJSON(raw json.RawMessage) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	return canonical(v)
}

// linCheck checks one device's operations with porcupine. On an illegal
// history it finds the shortest illegal prefix (operations invoked up to
// some instant, later responses left open: a prefix of a legal history is
// legal, so the search is a bisection) and writes porcupine's HTML
// visualization of it to vizPath. window is that prefix's last operations.
func linCheck(typ string, ops []porcupine.Operation, timeout time.Duration, vizPath string) (res porcupine.CheckResult, window []porcupine.Operation, err error) {
	model := fenceModel(typ)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	res = porcupine.CheckOperationsTimeout(model, ops, timeout)
	if res != porcupine.Illegal {
		return res, nil, nil
	}
	prefix := func(n int) []porcupine.Operation { return prefixOps(ops, n) }
	lo, hi := 1, len(ops) // prefix(hi) is illegal
	for lo < hi {
		mid := (lo + hi) / 2
		if porcupine.CheckOperationsTimeout(model, prefix(mid), timeout) == porcupine.Illegal {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	p := prefix(hi)
	_, info := porcupine.CheckOperationsVerbose(model, p, timeout)
	if vizPath != "" {
		err = porcupine.VisualizePath(model, info, vizPath)
	}
	from := max(0, len(p)-12)
	return res, p[from:], err
}

// prefixOps is the history of the first n operations (by invocation), as
// it stood when the n-th was invoked: responses after that are open. A
// prefix of a legal history is legal.
func prefixOps(ops []porcupine.Operation, n int) []porcupine.Operation {
	cut := ops[n-1].Call
	out := make([]porcupine.Operation, n)
	for i, o := range ops[:n] {
		if o.Return > cut {
			o.Output = opOut{open: true}
			o.Return = never
		}
		out[i] = o
	}
	return out
}

// visualizeUntil writes porcupine's visualization of the operations
// invoked up to t (a legal history is drawn with its linearization), for
// a violation the direct checks found on the device at t.
func visualizeUntil(typ string, ops []porcupine.Operation, t int64, timeout time.Duration, path string) error {
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	n := sort.Search(len(ops), func(i int) bool { return ops[i].Call > t })
	if n == 0 {
		return nil
	}
	model := fenceModel(typ)
	_, info := porcupine.CheckOperationsVerbose(model, prefixOps(ops, n), timeout)
	return porcupine.VisualizePath(model, info, path)
}

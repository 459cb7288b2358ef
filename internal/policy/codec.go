package policy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/edge-agent/edge-agent/plugins/sdk/jsonscan"
)

// The host encodes the input and decodes the output by hand: on the hot
// path of a small plugin the JSON codec is most of the host's own cost
// (BENCHMARKS.md ("Policy plugins")), and both documents have a fixed shape.

var emptyObject = json.RawMessage("{}")

// appendInput appends the input document of docs/plugin-abi.md to b. Raw fields
// must be valid JSON (ErrBadInput otherwise): a raw field that is not could
// change the document's structure around it.
func appendInput(b []byte, in *Input) ([]byte, error) {
	b = append(b, `{"device":{"id":`...)
	b = jsonscan.AppendString(b, in.Device.ID)
	b = append(b, `,"type":`...)
	b = jsonscan.AppendString(b, in.Device.Type)
	b = append(b, `},"command":{"op_id":`...)
	b = jsonscan.AppendString(b, in.Command.OpID)
	b = append(b, `,"fence":`...)
	b = strconv.AppendInt(b, in.Command.Fence, 10)
	b = append(b, `,"action":`...)
	b = jsonscan.AppendString(b, in.Command.Action)
	b = append(b, `,"params":`...)
	var err error
	if b, err = appendRaw(b, in.Command.Params, "command.params"); err != nil {
		return b, err
	}
	if in.Command.Holder != "" {
		b = append(b, `,"holder":`...)
		b = jsonscan.AppendString(b, in.Command.Holder)
	}
	b = append(b, `},"state":`...)
	if b, err = appendRaw(b, in.State, "state"); err != nil {
		return b, err
	}
	if len(in.Group) > 0 {
		b = append(b, `,"group":{`...)
		ids := make([]string, 0, len(in.Group))
		for id := range in.Group {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for i, id := range ids {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonscan.AppendString(b, id)
			b = append(b, ':')
			if b, err = appendRaw(b, in.Group[id], "group."+id); err != nil {
				return b, err
			}
		}
		b = append(b, '}')
	}
	b = append(b, `,"last_fence":`...)
	b = strconv.AppendInt(b, in.LastFence, 10)
	b = append(b, `,"now":"`...)
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `"}`...)
	return b, nil
}

// appendRaw appends a raw JSON value; empty or null becomes {}.
func appendRaw(b []byte, raw json.RawMessage, what string) ([]byte, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return append(b, emptyObject...), nil
	}
	if !validJSON(raw) {
		return b, fmt.Errorf("%w: %s", ErrBadInput, what)
	}
	return append(b, raw...), nil
}

// decodeOutput parses {"allow": bool, "reason"?: string, "params"?: object}.
// Anything else (another key, a duplicate key, a wrong type, params on a
// denial, trailing data) is ErrBadOutput. Params is copied out of b.
func decodeOutput(b []byte) (Decision, error) {
	var d Decision
	bad := func(format string, args ...any) (Decision, error) {
		return Decision{}, fmt.Errorf("%w: "+format, append([]any{ErrBadOutput}, args...)...)
	}
	p := &jsonscan.Scanner{B: b}
	p.WS()
	if !p.Eat('{') {
		return bad("not a JSON object")
	}
	var seenAllow, seenReason, seenParams bool
	p.WS()
	if !p.Eat('}') {
		for {
			p.WS()
			ks, ke, esc, ok := p.Str()
			if !ok {
				return bad("invalid JSON")
			}
			key := string(b[ks:ke])
			if esc {
				key = unquote(b[ks-1 : ke+1])
			}
			p.WS()
			if !p.Eat(':') {
				return bad("invalid JSON")
			}
			p.WS()
			switch key {
			case "allow":
				if seenAllow {
					return bad("duplicate key \"allow\"")
				}
				seenAllow = true
				switch {
				case p.Lit("true"):
					d.Allow = true
				case p.Lit("false"):
				default:
					return bad("\"allow\" is not a boolean")
				}
			case "reason":
				if seenReason {
					return bad("duplicate key \"reason\"")
				}
				seenReason = true
				s, e, esc, ok := p.Str()
				if !ok {
					return bad("\"reason\" is not a string")
				}
				if esc {
					d.Reason = unquote(b[s-1 : e+1])
				} else {
					d.Reason = string(b[s:e])
				}
			case "params":
				if seenParams {
					return bad("duplicate key \"params\"")
				}
				seenParams = true
				start := p.I
				if p.I >= len(b) || b[p.I] != '{' {
					return bad("\"params\" is not an object")
				}
				if !p.Value(0, maxDepth) {
					return bad("invalid JSON in \"params\"")
				}
				d.Params = append(json.RawMessage(nil), b[start:p.I]...)
			default:
				return bad("unexpected key %q", key)
			}
			p.WS()
			if p.Eat('}') {
				break
			}
			if !p.Eat(',') {
				return bad("invalid JSON")
			}
		}
	}
	p.WS()
	if p.I != len(b) {
		return bad("data after the object")
	}
	if !seenAllow {
		return bad("no \"allow\"")
	}
	if d.Params != nil && !d.Allow {
		return bad("\"params\" on a denial")
	}
	return d, nil
}

func unquote(q []byte) string {
	var s string
	if err := json.Unmarshal(q, &s); err != nil {
		return string(q)
	}
	return s
}

// validJSON reports whether b is exactly one JSON value (with surrounding
// white space).
func validJSON(b []byte) bool { return jsonscan.Valid(b, maxDepth) }

// maxDepth bounds nesting, so a hostile document cannot exhaust the stack.
const maxDepth = 1000

// Package schema_test checks the machine-readable contract in docs/: the
// JSON Schemas of docs/schema/ against wire's codes and against real
// messages of a running agent, and docs/asyncapi.yaml (it parses, every
// $ref resolves, its channels, QoS and retained flags are the protocol's,
// its examples validate), and that the documentation links only to files
// in the repository.
package schema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/wirefast"
)

// The schema files, by the name the tests use.
var schemaFiles = map[string]string{
	"command":     "command.schema.json",
	"result":      "result.schema.json",
	"deviceState": "device-state.schema.json",
	"status":      "status.schema.json",
}

// compile compiles one schema file (draft 2020-12, formats asserted: an
// expires_at or at that is not an RFC 3339 date-time fails).
func compile(t testing.TB, file string) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	s, err := c.Compile(file)
	if err != nil {
		t.Fatalf("compiling %s: %v", file, err)
	}
	return s
}

// schemas compiles every schema of docs/schema.
func schemas(t testing.TB) map[string]*jsonschema.Schema {
	t.Helper()
	out := map[string]*jsonschema.Schema{}
	for name, file := range schemaFiles {
		out[name] = compile(t, file)
	}
	return out
}

// check validates one JSON document; a document that is not JSON is an
// error too.
func check(s *jsonschema.Schema, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// schemaJSON reads a schema file as a generic document.
func schemaJSON(t testing.TB, file string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return m
}

func enumOf(t testing.TB, schema map[string]any, prop string) []string {
	t.Helper()
	p, _ := schema["properties"].(map[string]any)[prop].(map[string]any)
	var out []string
	for _, v := range p["enum"].([]any) {
		out = append(out, v.(string))
	}
	slices.Sort(out)
	return out
}

// The Result schema and package wire are two statements of one table:
// the same codes, each with the status wire.StatusOf gives it, and a
// replay (duplicate: true) only of codes wire.Recorded records.
func TestResultSchemaAgreesWithWire(t *testing.T) {
	var codes []string
	for _, c := range wire.Codes {
		codes = append(codes, string(c))
	}
	slices.Sort(codes)
	rs := schemaJSON(t, schemaFiles["result"])
	if got := enumOf(t, rs, "code"); !slices.Equal(got, codes) {
		t.Errorf("result.schema.json code enum %v, wire.Codes %v", got, codes)
	}
	statuses := []string{string(wire.StatusApplied), string(wire.StatusFailed), string(wire.StatusRejected), string(wire.StatusUnknown)}
	slices.Sort(statuses)
	if got := enumOf(t, rs, "status"); !slices.Equal(got, statuses) {
		t.Errorf("result.schema.json status enum %v, want %v", got, statuses)
	}
	s := compile(t, schemaFiles["result"])
	result := func(code wire.Code, status wire.Status, dup bool) []byte {
		r := wire.Result{V: 1, OpID: "op-1", Device: "pump-7", Fence: 3, Status: status, Code: code,
			Reason: "x", LastFence: 3, Duplicate: dup}
		if code == wire.CodeUnauthorized {
			r.PayloadSHA256 = wire.PayloadDigest([]byte("the refused message"))
		}
		b, err := wirefast.MarshalResult(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range wire.Codes {
		for _, st := range []wire.Status{wire.StatusApplied, wire.StatusRejected, wire.StatusFailed, wire.StatusUnknown} {
			err := check(s, result(c, st, false))
			if want := st == wire.StatusOf(c); (err == nil) != want {
				t.Errorf("code %s with status %s: valid %v, want %v (%v)", c, st, err == nil, want, err)
			}
		}
		err := check(s, result(c, wire.StatusOf(c), true))
		if (err == nil) != wire.Recorded(c) {
			t.Errorf("code %s replayed (duplicate: true): valid %v, but wire.Recorded is %v (%v)", c, err == nil, wire.Recorded(c), err)
		}
	}
}

// A schema that accepts everything would pass the agent's messages: these
// broken ones must each fail, and their unbroken originals pass.
func TestBrokenMessagesDoNotValidate(t *testing.T) {
	s := schemas(t)
	okResult := `{"v":1,"op_id":"op-1","device":"pump-7","fence":742,"status":"applied","code":"ok","reason":"pump-7 applied set","last_fence":742,"duplicate":false,"output":{"rpm":1200},"at":"2026-11-30T10:00:00.123Z"}`
	okState := `{"device":"pump-7","last_fence":742,"last_op_id":"op-1","state":{"rpm":1200},"at":"2026-11-30T10:00:00Z"}`
	okCommand := `{"v":1,"op_id":"op-1","fence":742,"action":"set","params":{"rpm":1200},"lock":"l","holder":"h","reply_to":"a/b","expires_at":"2026-11-30T10:00:00Z"}`
	okStatus := `{"state":"online","version":"dev"}`
	for _, c := range []struct {
		schema, doc string
	}{
		{"result", okResult}, {"deviceState", okState}, {"command", okCommand}, {"status", okStatus},
		{"command", `{"op_id":"op-1","fence":9223372036854775807,"action":"fence"}`},
		{"deviceState", `{"device":"pump-7","last_fence":742,"last_op_id":"op-1","state":{"rpm":1200},"at":"2026-11-30T10:00:00Z","held_writes":1}`},
		{"status", `{"state":"online","version":"dev","role":"active","host":"gw-01"}`},
		{"result", strings.Replace(okResult, `"output":{"rpm":1200}`, `"output":{"rpm":1200},"rewritten_params":{"rpm":1200}`, 1)},
		{"result", `{"v":1,"device":"bad device!","status":"rejected","code":"invalid","reason":"x","last_fence":0,"duplicate":false,"at":"2026-11-30T10:00:00Z"}`},
	} {
		if err := check(s[c.schema], []byte(c.doc)); err != nil {
			t.Errorf("%s %s: %v", c.schema, c.doc, err)
		}
	}
	mutate := func(doc string, f func(m map[string]any)) string {
		var m map[string]any
		if err := json.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	del := func(k string) func(map[string]any) { return func(m map[string]any) { delete(m, k) } }
	for _, c := range []struct {
		name, schema, doc string
	}{
		{"Result without code", "result", mutate(okResult, del("code"))},
		{"Result without status", "result", mutate(okResult, del("status"))},
		{"Result without at", "result", mutate(okResult, del("at"))},
		{"Result without last_fence", "result", mutate(okResult, del("last_fence"))},
		{"Result without duplicate", "result", mutate(okResult, del("duplicate"))},
		{"Result without reason", "result", mutate(okResult, del("reason"))},
		{"Result without device", "result", mutate(okResult, del("device"))},
		{"Result without op_id (not invalid)", "result", mutate(okResult, del("op_id"))},
		{"Result without fence (not invalid)", "result", mutate(okResult, del("fence"))},
		{"Result v 2", "result", mutate(okResult, set("v", 2))},
		{"Result unknown code", "result", mutate(okResult, set("code", "stale"))},
		{"Result unknown status", "result", mutate(okResult, set("status", "done"))},
		{"Result ok but rejected", "result", mutate(okResult, set("status", "rejected"))},
		{"Result fence 0", "result", mutate(okResult, set("fence", 0))},
		{"Result fence 2^63", "result", strings.Replace(okResult, `"fence":742`, `"fence":9223372036854775808`, 1)},
		{"Result at not a time", "result", mutate(okResult, set("at", "yesterday"))},
		{"Result output on a rejection", "result", mutate(okResult, func(m map[string]any) { m["status"], m["code"] = "rejected", "stale_fence" })},
		{"Result output not an object", "result", mutate(okResult, set("output", 5))},
		{"Result rewritten_params not an object", "result", mutate(okResult, set("rewritten_params", []any{1}))},
		{"Result device not an ID", "result", mutate(okResult, set("device", "pump 7"))},
		{"Result unauthorized without payload_sha256", "result", mutate(okResult, func(m map[string]any) {
			m["status"], m["code"] = "rejected", "unauthorized"
			delete(m, "output")
		})},
		{"Result payload_sha256 on another code", "result", mutate(okResult, set("payload_sha256", wire.PayloadDigest(nil)))},
		{"Result payload_sha256 not a digest", "result", mutate(okResult, func(m map[string]any) {
			m["status"], m["code"], m["payload_sha256"] = "rejected", "unauthorized", "ABC"
			delete(m, "output")
		})},
		{"Result busy replayed", "result", mutate(okResult, func(m map[string]any) {
			m["status"], m["code"], m["duplicate"] = "rejected", "busy", true
			delete(m, "output")
		})},
		{"DeviceState without state", "deviceState", mutate(okState, del("state"))},
		{"DeviceState without last_fence", "deviceState", mutate(okState, del("last_fence"))},
		{"DeviceState state not an object", "deviceState", mutate(okState, set("state", "on"))},
		{"DeviceState negative last_fence", "deviceState", mutate(okState, set("last_fence", -1))},
		{"DeviceState negative held_writes", "deviceState", mutate(okState, set("held_writes", -1))},
		{"DeviceState held_writes a string", "deviceState", mutate(okState, set("held_writes", "1"))},
		{"Command without op_id", "command", mutate(okCommand, del("op_id"))},
		{"Command without fence", "command", mutate(okCommand, del("fence"))},
		{"Command without action", "command", mutate(okCommand, del("action"))},
		{"Command fence 0", "command", mutate(okCommand, set("fence", 0))},
		{"Command fence 1.5", "command", mutate(okCommand, set("fence", 1.5))},
		{"Command fence 2^63", "command", strings.Replace(okCommand, `"fence":742`, `"fence":9223372036854775808`, 1)},
		{"Command fence a string", "command", mutate(okCommand, set("fence", "742"))},
		{"Command op_id with a space", "command", mutate(okCommand, set("op_id", "op 1"))},
		{"Command op_id of 129 characters", "command", mutate(okCommand, set("op_id", strings.Repeat("a", 129)))},
		{"Command action upper case", "command", mutate(okCommand, set("action", "Set"))},
		{"Command action of 65 characters", "command", mutate(okCommand, set("action", "a"+strings.Repeat("b", 64)))},
		{"Command params an array", "command", mutate(okCommand, set("params", []any{1}))},
		{"Command reply_to a filter", "command", mutate(okCommand, set("reply_to", "a/+/b"))},
		{"Command v 2", "command", mutate(okCommand, set("v", 2))},
		{"Command expires_at not a time", "command", mutate(okCommand, set("expires_at", "tomorrow"))},
		{"Command not an object", "command", `[1]`},
		{"status other state", "status", mutate(okStatus, set("state", "away"))},
		{"status without version", "status", mutate(okStatus, del("version"))},
		{"status role standby", "status", mutate(okStatus, set("role", "standby"))},
		{"status host a number", "status", mutate(okStatus, set("host", 1))},
	} {
		if err := check(s[c.schema], []byte(c.doc)); err == nil {
			t.Errorf("%s: %s validates against the %s schema", c.name, c.doc, c.schema)
		}
	}
}

// The reserved names of the protocol, spelled the same in the schemas as
// in wire.
func TestCommandSchemaPatternsAreWires(t *testing.T) {
	s := compile(t, schemaFiles["command"])
	for _, c := range []struct {
		field, value string
		valid        bool
	}{
		{"op_id", "a.B_9:-", true}, {"op_id", strings.Repeat("x", 128), true}, {"op_id", "", false}, {"op_id", "a/b", false},
		{"action", "set_rpm2", true}, {"action", "2set", false}, {"action", "set-rpm", false}, {"action", "", false},
	} {
		doc := map[string]any{"op_id": "op-1", "fence": 1, "action": "set"}
		doc[c.field] = c.value
		b, _ := json.Marshal(doc)
		err := check(s, b)
		if (err == nil) != c.valid {
			t.Errorf("%s %q: valid %v, want %v (%v)", c.field, c.value, err == nil, c.valid, err)
		}
		var wireOK bool
		switch c.field {
		case "op_id":
			wireOK = wire.ValidOpID(c.value)
		case "action":
			wireOK = wire.ValidAction(c.value)
		}
		if wireOK != c.valid {
			t.Errorf("%s %q: wire says %v, the schema %v", c.field, c.value, wireOK, c.valid)
		}
	}
}

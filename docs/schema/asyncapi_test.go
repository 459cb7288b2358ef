package schema_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/edge-agent/edge-agent/controller/wire"
)

const asyncAPIFile = "../asyncapi.yaml"

func loadAsyncAPI(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(asyncAPIFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s does not parse as YAML: %v", asyncAPIFile, err)
	}
	return doc
}

// refs collects every $ref value in v with the path where it stands.
func refs(v any, at string, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == "$ref" {
				if s, ok := e.(string); ok {
					out[at] = s
				} else {
					out[at] = fmt.Sprintf("!non-string %v", e)
				}
				continue
			}
			refs(e, at+"/"+k, out)
		}
	case []any:
		for i, e := range x {
			refs(e, at+"/"+strconv.Itoa(i), out)
		}
	}
}

// pointer resolves an RFC 6901 JSON Pointer in doc.
func pointer(doc any, ptr string) (any, error) {
	if ptr == "" {
		return doc, nil
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, fmt.Errorf("pointer %q does not start with /", ptr)
	}
	cur := doc
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := cur.(type) {
		case map[string]any:
			next, ok := x[tok]
			if !ok {
				return nil, fmt.Errorf("no member %q", tok)
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(x) {
				return nil, fmt.Errorf("no element %q", tok)
			}
			cur = x[i]
		default:
			return nil, fmt.Errorf("%q: not an object or array", tok)
		}
	}
	return cur, nil
}

// resolve follows one $ref of the AsyncAPI document: a fragment in the
// document itself, or a file beside it (JSON or YAML) with an optional
// fragment. It returns the file ("" for the document itself) and the
// target.
func resolve(t *testing.T, doc map[string]any, ref string) (string, any, error) {
	file, frag, _ := strings.Cut(ref, "#")
	target := any(doc)
	if file != "" {
		if strings.Contains(file, "://") {
			return "", nil, fmt.Errorf("%s: only files of the repository are referenced", ref)
		}
		path := filepath.Join(filepath.Dir(asyncAPIFile), filepath.FromSlash(file))
		b, err := os.ReadFile(path)
		if err != nil {
			return "", nil, err
		}
		var v any
		if strings.HasSuffix(path, ".json") {
			err = json.Unmarshal(b, &v)
		} else {
			err = yaml.Unmarshal(b, &v)
		}
		if err != nil {
			return "", nil, fmt.Errorf("%s: %w", path, err)
		}
		target, file = v, path
	}
	v, err := pointer(target, frag)
	return file, v, err
}

// The AsyncAPI document parses, is AsyncAPI 3.0, and every $ref in it
// resolves: internal ones to a member that exists, external ones to a
// schema file of docs/schema that compiles as draft 2020-12.
func TestAsyncAPIRefsResolve(t *testing.T) {
	doc := loadAsyncAPI(t)
	if v := doc["asyncapi"]; v != "3.0.0" {
		t.Fatalf("asyncapi: %v, want 3.0.0", v)
	}
	all := map[string]string{}
	refs(doc, "", all)
	if len(all) < 20 {
		t.Fatalf("only %d $refs found: %v", len(all), all)
	}
	files := map[string]bool{}
	for at, ref := range all {
		file, _, err := resolve(t, doc, ref)
		if err != nil {
			t.Errorf("%s: $ref %q does not resolve: %v", at, ref, err)
			continue
		}
		if file != "" {
			files[file] = true
		}
	}
	var want []string
	for _, f := range schemaFiles {
		want = append(want, filepath.Join("..", "schema", f))
	}
	var got []string
	for f := range files {
		got = append(got, f)
		compile(t, f) // a valid 2020-12 schema (the compiler checks it against the meta-schema)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("the document references %v, want every schema of docs/schema: %v", got, want)
	}
	// A broken reference is caught.
	if _, _, err := resolve(t, doc, "#/components/messages/nosuch"); err == nil {
		t.Error("a $ref to a missing member resolved")
	}
	if _, _, err := resolve(t, doc, "./schema/nosuch.schema.json"); err == nil {
		t.Error("a $ref to a missing file resolved")
	}
}

func member(t *testing.T, doc map[string]any, ptr string) any {
	t.Helper()
	v, err := pointer(doc, ptr)
	if err != nil {
		t.Fatalf("%s: %v", ptr, err)
	}
	return v
}

// The channels, QoS and retained flags are the protocol's (section 1).
func TestAsyncAPIChannelsAreTheProtocols(t *testing.T) {
	doc := loadAsyncAPI(t)
	p, gw, dev := "{prefix}", "{gateway}", "{device}"
	channels := map[string]any{
		"command": wire.CmdTopic(p, gw, dev),
		"result":  wire.ResultTopic(p, gw, dev),
		"state":   wire.StateTopic(p, gw, dev),
		"status":  wire.StatusTopic(p, gw),
		"replyTo": nil, // the command's reply_to
	}
	got := member(t, doc, "/channels").(map[string]any)
	if len(got) != len(channels) {
		t.Errorf("channels %v, want %v", got, channels)
	}
	for name, addr := range channels {
		if a := member(t, doc, "/channels/"+name+"/address"); a != addr {
			t.Errorf("channel %s: address %v, want %v", name, a, addr)
		}
	}
	if d := member(t, doc, "/components/parameters/prefix/default"); d != wire.DefaultPrefix {
		t.Errorf("prefix default %v, want %s", d, wire.DefaultPrefix)
	}
	ops := map[string]struct {
		action, channel, message string
		retain                   bool
	}{
		"receiveCommand": {"receive", "command", "command", false},
		"sendResult":     {"send", "result", "result", false},
		"sendState":      {"send", "state", "deviceState", true},
		"sendStatus":     {"send", "status", "status", true},
	}
	if n := len(member(t, doc, "/operations").(map[string]any)); n != len(ops) {
		t.Errorf("%d operations, want %d", n, len(ops))
	}
	for name, o := range ops {
		base := "/operations/" + name
		if a := member(t, doc, base+"/action"); a != o.action {
			t.Errorf("%s: action %v, want %s", name, a, o.action)
		}
		if c := member(t, doc, base+"/channel/$ref"); c != "#/channels/"+o.channel {
			t.Errorf("%s: channel %v, want #/channels/%s", name, c, o.channel)
		}
		if q := member(t, doc, base+"/bindings/mqtt/qos"); q != 1 {
			t.Errorf("%s: qos %v, want 1", name, q)
		}
		if r := member(t, doc, base+"/bindings/mqtt/retain"); r != o.retain {
			t.Errorf("%s: retain %v, want %v", name, r, o.retain)
		}
		msgs := member(t, doc, base+"/messages").([]any)
		ref := msgs[0].(map[string]any)["$ref"]
		if len(msgs) != 1 || ref != "#/channels/"+o.channel+"/messages/"+o.message {
			t.Errorf("%s: messages %v", name, msgs)
		}
	}
	// The reply: to the command's reply_to, with a Result.
	if l := member(t, doc, "/operations/receiveCommand/reply/address/location"); l != "$message.payload#/reply_to" {
		t.Errorf("reply address %v", l)
	}
	if c := member(t, doc, "/operations/receiveCommand/reply/channel/$ref"); c != "#/channels/replyTo" {
		t.Errorf("reply channel %v", c)
	}
	for msg, file := range map[string]string{"command": "command", "result": "result", "deviceState": "deviceState", "status": "status"} {
		if r := member(t, doc, "/components/messages/"+msg+"/payload/schema/$ref"); r != "./schema/"+schemaFiles[file] {
			t.Errorf("message %s: payload %v, want ./schema/%s", msg, r, schemaFiles[file])
		}
		if f := member(t, doc, "/components/messages/"+msg+"/payload/schemaFormat"); f != "application/schema+json;version=draft-2020-12" {
			t.Errorf("message %s: schemaFormat %v", msg, f)
		}
	}
}

// Every example payload in the document is valid under its message's
// schema.
func TestAsyncAPIExamplesValidate(t *testing.T) {
	doc := loadAsyncAPI(t)
	s := schemas(t)
	n := 0
	for name, m := range member(t, doc, "/components/messages").(map[string]any) {
		ex, _ := m.(map[string]any)["examples"].([]any)
		if len(ex) == 0 {
			t.Errorf("message %s has no example", name)
		}
		for i, e := range ex {
			b, err := json.Marshal(e.(map[string]any)["payload"])
			if err != nil {
				t.Fatal(err)
			}
			if err := check(s[name], b); err != nil {
				t.Errorf("message %s example %d %s: %v", name, i, b, err)
			}
			n++
		}
	}
	if n < 4 {
		t.Fatalf("%d examples checked", n)
	}
}

// The document is a valid AsyncAPI 3.0.0 document by the specification's
// own JSON Schema (testdata/asyncapi: operations, replies, MQTT bindings
// and all), and a document with one operation broken is not.
func TestAsyncAPIDocumentIsValidAsyncAPI3(t *testing.T) {
	c := jsonschema.NewCompiler()
	spec, err := c.Compile("testdata/asyncapi/asyncapi-3.0.0.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	asJSON := func(doc map[string]any) any {
		b, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if err := spec.Validate(asJSON(loadAsyncAPI(t))); err != nil {
		t.Fatalf("%s is not a valid AsyncAPI 3.0.0 document: %v", asyncAPIFile, err)
	}
	for name, breakIt := range map[string]func(map[string]any){
		"action publish (AsyncAPI 2)": func(d map[string]any) {
			d["operations"].(map[string]any)["sendResult"].(map[string]any)["action"] = "publish"
		},
		"qos 3": func(d map[string]any) {
			d["operations"].(map[string]any)["sendState"].(map[string]any)["bindings"].(map[string]any)["mqtt"].(map[string]any)["qos"] = 3
		},
		"a reply with a description": func(d map[string]any) {
			d["operations"].(map[string]any)["receiveCommand"].(map[string]any)["reply"].(map[string]any)["description"] = "x"
		},
	} {
		doc := loadAsyncAPI(t)
		breakIt(doc)
		if err := spec.Validate(asJSON(doc)); err == nil {
			t.Errorf("%s: the broken document validates", name)
		}
	}
}

package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// unknownKeys adds a problem for every key of the document that the
// configuration has no place for, at any depth, named by its key path and
// line as a user reads them: `mqtt.embeded_listen (line 4): unknown key;
// did you mean embedded_listen?`. A device's driver block is checked
// against its kind's registered keys. It stops at the values that decode
// themselves (durations, a policy's config), and walks an anchor's value
// once however many aliases name it.
//
// It also adds a problem for every value that is not written as its key
// takes (a word where a number goes, a mapping where a list goes), in the
// same words, and returns the lines of those: the decoder reports them
// too, in its own words (`cannot unmarshal !!str into int`), which Parse
// leaves out.
func unknownKeys(p *Problems, root *yaml.Node) map[int]bool {
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	w := keyWalker{p: p, seen: map[*yaml.Node]bool{}, lines: map[int]bool{}}
	w.walk(root, reflect.TypeFor[Config](), "")
	return w.lines
}

type keyWalker struct {
	p     *Problems
	seen  map[*yaml.Node]bool // the anchors' values walked
	lines map[int]bool        // the lines of the values of the wrong type
}

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	nodeType        = reflect.TypeFor[yaml.Node]()
	deviceType      = reflect.TypeFor[Device]()
	driverType      = reflect.TypeFor[Driver]()
	durationType    = reflect.TypeFor[Duration]()
)

func (w keyWalker) walk(n *yaml.Node, t reflect.Type, path string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || w.seen[n.Alias] {
			return
		}
		w.seen[n.Alias] = true
		n = n.Alias
	}
	if t == nodeType || n.ShortTag() == "!!null" { // anything, or nothing given
		return
	}
	if want := w.mismatch(n, t); want != "" {
		w.lines[n.Line] = true
		w.p.Add(fmt.Sprintf("%s (line %d)", path, n.Line), "want %s, got %s", want, shown(n))
		return
	}
	switch {
	case t == driverType:
		if keys := driverKeys(n); keys != nil {
			w.mapping(n, keys, path)
		}
	case t == deviceType:
		w.mapping(n, yamlFields(t, map[string]reflect.Type{}), path)
	case t == durationType:
		if _, err := parseDuration(n); err != nil {
			w.lines[n.Line] = true
			w.p.Add(fmt.Sprintf("%s (line %d)", path, n.Line), "%v", err)
		}
	case reflect.PointerTo(t).Implements(unmarshalerType): // decodes itself: yaml's error stands
	case t.Kind() == reflect.Struct:
		w.mapping(n, yamlFields(t, map[string]reflect.Type{}), path)
	case t.Kind() == reflect.Map:
		for i := 0; i+1 < len(n.Content); i += 2 {
			w.walk(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		for i, e := range n.Content {
			w.walk(e, t.Elem(), fmt.Sprintf("%s[%d]%s", path, i, idOf(e)))
		}
	}
}

// mismatch is what a value of t is written as, when n is not that (a
// mapping where a list goes, a word where a number goes); else "".
func (w keyWalker) mismatch(n *yaml.Node, t reflect.Type) string {
	switch {
	case t == durationType || t.Kind() == reflect.Interface:
		return ""
	case t == driverType || t == deviceType || t.Kind() == reflect.Struct || t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			return "a mapping (key: value)"
		}
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return "a list"
		}
	case n.Kind != yaml.ScalarNode:
		return "a single value"
	case t.Kind() == reflect.String:
	case n.Decode(reflect.New(t).Interface()) != nil:
		switch t.Kind() {
		case reflect.Bool:
			return "true or false"
		case reflect.Float32, reflect.Float64:
			return "a number"
		default:
			return "a whole number"
		}
	}
	return ""
}

// shown is a value as the file wrote it, for a message.
func shown(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "*" + n.Value
	}
	return strconv.Quote(n.Value)
}

// mapping checks the keys of one mapping against fields, each key's type.
func (w keyWalker) mapping(n *yaml.Node, fields map[string]reflect.Type, path string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.ShortTag() == "!!merge" { // <<: *anchor merges the anchor's keys here
			if v.Kind == yaml.SequenceNode {
				for _, e := range v.Content {
					w.mapping(aliased(e), fields, path)
				}
			} else {
				w.mapping(aliased(v), fields, path)
			}
			continue
		}
		ft, ok := fields[k.Value]
		if !ok {
			w.p.Add(fmt.Sprintf("%s (line %d)", join(path, k.Value), k.Line), "unknown key; %s", suggest(k.Value, fields))
			continue
		}
		w.walk(v, ft, join(path, k.Value))
	}
}

func aliased(n *yaml.Node) *yaml.Node {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// driverKeys are the keys of a driver block: kind, resends and
// resolve_settle, and those of its kind's registered configuration (none
// for a kind that no driver registered: check reports the kind).
func driverKeys(n *yaml.Node) map[string]reflect.Type {
	keys := map[string]reflect.Type{
		"kind":           reflect.TypeFor[string](),
		"resends":        reflect.TypeFor[int](),
		"resolve_settle": reflect.TypeFor[Duration](),
	}
	kind := DefaultDriverKind
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == "kind" && n.Content[i+1].Kind == yaml.ScalarNode && n.Content[i+1].Value != "" {
				kind = n.Content[i+1].Value
			}
		}
	}
	dc := driverConfig(kind)
	if dc == nil {
		return nil
	}
	t := reflect.TypeOf(dc)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return yamlFields(t, keys)
}

// idOf is " (ID)" for a list entry with an id (a device, a key), as the
// configuration's problems name it; else "".
func idOf(n *yaml.Node) string {
	n = aliased(n)
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "id" && n.Content[i+1].Kind == yaml.ScalarNode && n.Content[i+1].Value != "" {
			return " (" + n.Content[i+1].Value + ")"
		}
	}
	return ""
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// suggest names the known key closest to key when one is close enough (a
// typo: "did you mean embedded_listen?"), else every key known there.
func suggest(key string, fields map[string]reflect.Type) string {
	known := make([]string, 0, len(fields))
	for k := range fields {
		known = append(known, k)
	}
	slices.Sort(known)
	if len(known) == 0 {
		return "this block takes no other keys"
	}
	best, bestD := "", -1
	for _, k := range known {
		if d := distance(strings.ToLower(key), k); bestD < 0 || d < bestD {
			best, bestD = k, d
		}
	}
	if bestD <= max(2, len(key)/4) {
		return "did you mean " + best + "?"
	}
	return "the keys here are " + strings.Join(known, ", ")
}

// distance is the Levenshtein distance of a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// yamlFields adds the keys of struct t, by yaml.v3's rules (the tag's
// name, else the field's name in lower case; inline structs' keys as
// their own; "-" skipped), with each key's type.
func yamlFields(t reflect.Type, into map[string]reflect.Type) map[string]reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		key, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				yamlFields(ft, into)
			}
			continue
		}
		if key == "" {
			key = strings.ToLower(f.Name)
		}
		into[key] = f.Type
	}
	return into
}

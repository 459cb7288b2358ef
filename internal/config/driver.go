package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"
)

// Driver is a device's `driver:` block. Its kind and resends are the
// agent's; every other key belongs to the kind, whose driver package owns
// their type, defaults and checks (RegisterDriver): config decodes the
// block by kind, and knows no driver.
type Driver struct {
	// Kind names the driver (default DefaultDriverKind).
	Kind string
	// Resends is how many times a write the device confirmed unapplied is
	// sent again under a new key (extension, docs/config.md; default
	// DefaultResends).
	Resends int
	// ResolveSettle is how long after the agent stopped waiting for a
	// write to this device (its last try ended) an operator's answer for
	// it is refused: the write may still land until then (docs/config.md;
	// default DefaultResolveSettle). Any kind.
	ResolveSettle Duration
	// Config is the kind's keys, decoded into the type its driver
	// registered; nil when no driver registered Kind.
	Config DriverConfig
}

// DefaultDriverKind is the kind of a driver block without kind.
const DefaultDriverKind = "http"

// DriverConfig is the configuration of one kind of driver: the keys of
// its `driver:` block besides kind and resends. Its driver package
// registers a constructor with RegisterDriver.
type DriverConfig interface {
	// Defaults fills in the defaults of the keys left unset.
	Defaults()
	// Check adds a problem for every rule the block breaks, each under
	// key (e.g. `devices[0] (p).driver`) and its own key. It reads no
	// file.
	Check(p *Problems, key string)
}

var drivers = struct {
	sync.RWMutex
	m map[string]func() DriverConfig
}{m: map[string]func() DriverConfig{}}

// RegisterDriver makes kind a driver kind: new returns the kind's
// configuration (with any defaults that decoding keeps), which a
// `driver:` block of that kind is decoded into, as strictly as the rest of
// the file. A driver package calls it from init; registering a kind twice
// panics.
func RegisterDriver(kind string, new func() DriverConfig) {
	drivers.Lock()
	defer drivers.Unlock()
	if _, dup := drivers.m[kind]; dup {
		panic("config: driver kind " + kind + " registered twice")
	}
	drivers.m[kind] = new
}

func driverKinds() []string {
	drivers.RLock()
	defer drivers.RUnlock()
	return slices.Sorted(maps.Keys(drivers.m))
}

func driverConfig(kind string) DriverConfig {
	drivers.RLock()
	defer drivers.RUnlock()
	if f := drivers.m[kind]; f != nil {
		return f()
	}
	return nil
}

// UnmarshalYAML decodes kind, resends and resolve_settle, then the other keys into the
// kind's registered configuration. Unknown keys are errors, worded and
// numbered as the decoder words them elsewhere.
func (dr *Driver) UnmarshalYAML(n *yaml.Node) error {
	*dr = Driver{Kind: DefaultDriverKind, Resends: DefaultResends, ResolveSettle: Duration(DefaultResolveSettle)}
	if n.Kind != yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cannot unmarshal %s `%s` into config.Driver", n.Line, n.ShortTag(), n.Value)}}
	}
	own := &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Column: n.Column}
	rest := &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Column: n.Column}
	for i := 0; i+1 < len(n.Content); i += 2 {
		to := rest
		if k := n.Content[i].Value; k == "kind" || k == "resends" || k == "resolve_settle" {
			to = own
		}
		to.Content = append(to.Content, n.Content[i], n.Content[i+1])
	}
	keys := struct {
		Kind          string   `yaml:"kind"`
		Resends       int      `yaml:"resends"`
		ResolveSettle Duration `yaml:"resolve_settle"`
	}{dr.Kind, dr.Resends, dr.ResolveSettle}
	var unknown []string
	switch err := own.Decode(&keys).(type) {
	case nil:
	case *yaml.TypeError:
		unknown = err.Errors
	default:
		return err
	}
	dr.Kind, dr.Resends, dr.ResolveSettle = keys.Kind, keys.Resends, keys.ResolveSettle
	if dr.Kind == "" {
		dr.Kind = DefaultDriverKind
	}
	dr.Config = driverConfig(dr.Kind)
	if dr.Config == nil { // check reports the kind
		return typeErrors(unknown, nil)
	}
	unknown = append(unknown, unknownFields(rest, reflect.TypeOf(dr.Config), "config.Driver")...)
	return typeErrors(unknown, rest.Decode(dr.Config))
}

// typeErrors joins the unknown keys' errors and a decode error into the
// decoder's *yaml.TypeError (which it merges into its own); another error
// stops the decoding and is returned as it is.
func typeErrors(unknown []string, err error) error {
	if te, ok := err.(*yaml.TypeError); ok {
		unknown = append(unknown, te.Errors...)
	} else if err != nil {
		return err
	}
	if len(unknown) == 0 {
		return nil
	}
	return &yaml.TypeError{Errors: unknown}
}

var (
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	nodeType        = reflect.TypeFor[yaml.Node]()
)

// unknownFields is what a decoder with KnownFields(true) reports of n
// decoded into t: every key of a mapping that t's struct has no field
// for, at any depth, as "line N: field K not found in type T" (name is
// t's T). A node.Decode is not strict; this makes it so. It stops at the
// types that decode themselves (yaml.Unmarshaler, yaml.Node), and walks
// an anchor's value once however many aliases name it.
func unknownFields(n *yaml.Node, t reflect.Type, name string) []string {
	return walker{}.unknown(n, t, name)
}

// walker is unknownFields' state: the anchors' values already walked.
type walker map[*yaml.Node]bool

func (w walker) unknown(n *yaml.Node, t reflect.Type, name string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil || w[n.Alias] {
			return nil
		}
		w[n.Alias] = true
		n = n.Alias
	}
	if t == nodeType || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	var out []string
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields := yamlFields(t, map[string]reflect.Type{})
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				out = append(out, fmt.Sprintf("line %d: field %s not found in type %s", k.Line, k.Value, name))
				continue
			}
			out = append(out, w.unknown(v, ft, typeName(ft))...)
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 1; i < len(n.Content); i += 2 {
				out = append(out, w.unknown(n.Content[i], t.Elem(), typeName(t.Elem()))...)
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind == yaml.SequenceNode {
			for _, e := range n.Content {
				out = append(out, w.unknown(e, t.Elem(), typeName(t.Elem()))...)
			}
		}
	}
	return out
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

func typeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.String()
}

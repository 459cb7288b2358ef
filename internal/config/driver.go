package config

import (
	"fmt"
	"maps"
	"slices"
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

// UnmarshalYAML decodes kind, resends and resolve_settle, then the other
// keys into the kind's registered configuration. Its unknown keys are
// Parse's to report (unknownKeys).
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
	ownErr := own.Decode(&keys)
	if _, ok := ownErr.(*yaml.TypeError); ownErr != nil && !ok {
		return ownErr
	}
	dr.Kind, dr.Resends, dr.ResolveSettle = keys.Kind, keys.Resends, keys.ResolveSettle
	if dr.Kind == "" {
		dr.Kind = DefaultDriverKind
	}
	dr.Config = driverConfig(dr.Kind)
	if dr.Config == nil { // check reports the kind
		return ownErr
	}
	return typeErrors(ownErr, rest.Decode(dr.Config))
}

// typeErrors joins two decode errors into the decoder's *yaml.TypeError
// (which it merges into its own, and goes on decoding); another error
// stops the decoding and is returned as it is.
func typeErrors(a, b error) error {
	var all []string
	for _, err := range []error{a, b} {
		if te, ok := err.(*yaml.TypeError); ok {
			all = append(all, te.Errors...)
		} else if err != nil {
			return err
		}
	}
	if len(all) == 0 {
		return nil
	}
	return &yaml.TypeError{Errors: all}
}

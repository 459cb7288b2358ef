package device

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/configs"
	"github.com/edge-agent/edge-agent/internal/config"
)

// The driver block exactly as the contract (docs/protocol.md §11) gives it.
const modbusPump = `gateway_id: g
mqtt: {broker: embedded}
devices:
  - id: pump-9
    type: pump
    driver:
      kind: modbus
      url: tcp://10.0.0.7:502        # or rtuovertcp://
      unit_id: 1
      timeout: 1s                    # per request
      verify: readback               # optional, see 2
      settle: 500ms                  # read-back quiet period
      actions:
        set:  {params: {rpm: {register: 0, type: uint16, scale: 1}}}
        on:   {coil: 0, value: true}
        off:  {coil: 0, value: false}
      state: {rpm: {register: 0, type: uint16}, running: {coil: 0}}
`

func TestModbusContractShapeParses(t *testing.T) {
	c, err := config.Parse([]byte(modbusPump))
	if err != nil {
		t.Fatal(err)
	}
	dr := c.Device("pump-9").Driver.Config.(*ModbusConfig)
	if c.Device("pump-9").Driver.Kind != "modbus" || dr.URL != "tcp://10.0.0.7:502" || *dr.UnitID != 1 || dr.Timeout.D() != time.Second ||
		dr.Verify != "readback" || dr.Settle.D() != 500*time.Millisecond {
		t.Fatalf("driver: %+v", dr)
	}
	rpm := dr.Actions["set"].Params["rpm"]
	if *rpm.Register != 0 || rpm.Type != "uint16" || *rpm.Scale != 1 {
		t.Fatalf("set.params.rpm: %+v", rpm)
	}
	if on := dr.Actions["on"]; *on.Coil != 0 || on.Value != true {
		t.Fatalf("on: %+v", on)
	}
	if off := dr.Actions["off"]; off.Value != false {
		t.Fatalf("off: %+v", off)
	}
	if st := dr.State["running"]; st.Coil == nil || *st.Coil != 0 {
		t.Fatalf("state.running: %+v", st)
	}
}

func TestModbusDefaults(t *testing.T) {
	c, err := config.Parse([]byte(`gateway_id: g
mqtt: {broker: embedded}
devices:
  - {id: m, type: generic, driver: {kind: modbus, url: "rtuovertcp://127.0.0.1:5020", verify: readback,
      actions: {set: {params: {t: {register: 4, type: float32}}}}}}
  - {id: n, type: generic, driver: {kind: modbus, url: "tcp://127.0.0.1:5020", actions: {go: {coil: 1, value: true}}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	m, n := c.Device("m").Driver.Config.(*ModbusConfig), c.Device("n").Driver.Config.(*ModbusConfig)
	if *m.UnitID != 1 || m.Timeout.D() != DefaultModbusTimeout || m.Settle.D() != DefaultModbusSettle {
		t.Fatalf("m: %+v", m)
	}
	if pt := m.Actions["set"].Params["t"]; pt.WordOrder != "high_first" || *pt.Scale != 1 {
		t.Fatalf("float32 point defaults: %+v", pt)
	}
	if n.Settle != 0 || n.Verify != "" {
		t.Fatalf("without verify, no settle: %+v", n)
	}
}

func TestModbusErrorsNameTheKey(t *testing.T) {
	head := "gateway_id: g\nmqtt: {broker: embedded}\ndevices:\n  - {id: p, type: pump, driver: "
	ok := `actions: {set: {params: {rpm: {register: 0}}}}`
	for _, tc := range []struct{ name, driver, want string }{
		{"http url", `{kind: modbus, url: "http://x", ` + ok + `}`, `devices[0] (p).driver.url: "http://x": want tcp://`},
		{"no port", `{kind: modbus, url: "tcp://x", ` + ok + `}`, `devices[0] (p).driver.url: "tcp://x": want tcp://host:port`},
		{"rtu timeout", `{kind: modbus, url: "rtuovertcp://x:502", timeout: 10ms, ` + ok + `}`, `devices[0] (p).driver.timeout: 10ms is too short for rtuovertcp://`},
		{"unit 0", `{kind: modbus, url: "tcp://x:502", unit_id: 0, ` + ok + `}`, `devices[0] (p).driver.unit_id: 0`},
		{"verify", `{kind: modbus, url: "tcp://x:502", verify: crc, ` + ok + `}`, `devices[0] (p).driver.verify: "crc"`},
		{"settle without readback", `{kind: modbus, url: "tcp://x:502", settle: 1s, ` + ok + `}`, `devices[0] (p).driver.settle: only with verify: readback`},
		{"settle too long", `{kind: modbus, url: "tcp://x:502", verify: readback, settle: 2m, ` + ok + `}`, `devices[0] (p).driver.settle: 2m0s`},
		{"queryable", `{kind: modbus, url: "tcp://x:502", queryable: true, ` + ok + `}`, `devices[0] (p).driver.queryable: only with kind: http`},
		{"retries", `{kind: modbus, url: "tcp://x:502", retries: 1, ` + ok + `}`, `devices[0] (p).driver.retries: only with kind: http`},
		{"no actions", `{kind: modbus, url: "tcp://x:502"}`, `devices[0] (p).driver.actions: at least one`},
		{"fence action", `{kind: modbus, url: "tcp://x:502", actions: {fence: {coil: 0, value: true}}}`, `devices[0] (p).driver.actions.fence: fence is the reserved`},
		{"bad type", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {rpm: {register: 0, type: uint8}}}}}`, `devices[0] (p).driver.actions.set.params.rpm.type: "uint8"`},
		{"register and coil", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {rpm: {register: 0, coil: 0}}}}}`, `actions.set.params.rpm: register or coil, not both`},
		{"register range", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {rpm: {register: 65535, type: uint32}}}}}`, `actions.set.params.rpm.register: 65535: must be from 0 to 65534`},
		{"zero scale", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {rpm: {register: 0, scale: 0}}}}}`, `actions.set.params.rpm.scale: 0`},
		{"word order on 16 bits", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {rpm: {register: 0, word_order: low_first}}}}}`, `actions.set.params.rpm.word_order: only for the 32-bit types`},
		{"coil with type", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {on: {coil: 0, type: uint16}}}}}`, `actions.set.params.on: type, scale and word_order are for registers`},
		{"overlap", `{kind: modbus, url: "tcp://x:502", actions: {set: {params: {a: {register: 0, type: uint32}, b: {register: 1}}}}}`, `actions.set: params.a and params.b both write register 1`},
		{"coil value", `{kind: modbus, url: "tcp://x:502", actions: {on: {coil: 0, value: 1}}}`, `actions.on.value: 1: a coil takes true or false`},
		{"register value", `{kind: modbus, url: "tcp://x:502", actions: {stop: {register: 0, value: 70000}}}`, `actions.stop.value: 70000: 70000 is out of the uint16 range`},
		{"missing value", `{kind: modbus, url: "tcp://x:502", actions: {stop: {register: 0}}}`, `actions.stop.value: required`},
		{"state point", `{kind: modbus, url: "tcp://x:502", ` + ok + `, state: {rpm: {}}}`, `devices[0] (p).driver.state.rpm: give register or coil`},
		{"modbus keys on http", `{url: "http://x", unit_id: 3}`, `devices[0] (p).driver: unit_id, verify, settle, actions and state are only for kind: modbus`},
		{"unknown key", `{kind: modbus, url: "tcp://x:502", registers: 1, ` + ok + `}`, `devices[0] (p).driver.registers (line 4): unknown key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(head + tc.driver + "}\n"))
			if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalid naming %q", err, tc.want)
			}
		})
	}
}

func TestFitsModbus(t *testing.T) {
	for _, tc := range []struct {
		typ string
		v   float64
		ok  bool
	}{
		{"uint16", 0, true}, {"uint16", 65535, true}, {"uint16", 65536, false}, {"uint16", -1, false}, {"uint16", 1.5, false},
		{"int16", -32768, true}, {"int16", 32768, false},
		{"uint32", 4294967295, true}, {"uint32", 4294967296, false},
		{"int32", -2147483648, true}, {"int32", 2147483648, false},
		{"float32", 1.5, true}, {"float32", 1e39, false},
	} {
		if err := FitsModbus(tc.typ, tc.v); (err == nil) != tc.ok {
			t.Errorf("FitsModbus(%s, %v) = %v, want ok %v", tc.typ, tc.v, err, tc.ok)
		}
	}
}

func TestShippedModbusExampleParses(t *testing.T) {
	c, err := config.Parse(configs.AgentModbusYAML)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Device("pump-9").Driver.Config.(*ModbusConfig)
	if c.Device("pump-9").Driver.Kind != "modbus" || p.Verify != "readback" || p.Settle.D() != 500*time.Millisecond || *p.UnitID != 1 {
		t.Fatalf("pump-9: %+v", p)
	}
	if r := c.Device("relay-9").Driver.Config.(*ModbusConfig); r.Verify != "" || *r.UnitID != 2 || r.Timeout.D() != DefaultModbusTimeout {
		t.Fatalf("relay-9: %+v", r)
	}
}

package wire_test

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// A command as a controller publishes it, on its device's cmd topic.
func ExampleCommand() {
	cmd := wire.Command{V: wire.Version, OpID: "op-1", Fence: 42, Action: "set",
		Params: json.RawMessage(`{"rpm":1200}`), Lock: "locks/device/pump-7", Holder: "planner-1",
		ReplyTo: "edge/gw-1/controllers/planner-1/reply"}
	b, _ := json.Marshal(cmd)
	fmt.Println(wire.CmdTopic(wire.DefaultPrefix, "gw-1", "pump-7"))
	fmt.Println(string(b))
	// Output:
	// edge/gw-1/devices/pump-7/cmd
	// {"v":1,"op_id":"op-1","fence":42,"action":"set","params":{"rpm":1200},"lock":"locks/device/pump-7","holder":"planner-1","reply_to":"edge/gw-1/controllers/planner-1/reply"}
}

// ParseCommand reads a command as the agent does; an invalid one is a
// *ParseError that still carries what could be read, for the invalid
// Result.
func ExampleParseCommand() {
	c, err := wire.ParseCommand([]byte(`{"op_id":"op-1","fence":42,"action":"set","params":{"rpm":1200}}`))
	fmt.Println(c.OpID, c.Fence, c.Action, string(c.Params), err)

	_, err = wire.ParseCommand([]byte(`{"op_id":"op-2","fence":0,"action":"set"}`))
	var pe *wire.ParseError
	if errors.As(err, &pe) {
		fmt.Println(pe.OpID, pe.Reason)
	}
	// Output:
	// op-1 42 set {"rpm":1200} <nil>
	// op-2 fence must be an integer from 1 to 2^63-1, got 0
}

// StatusOf gives a code's status; only a final status ends a Send.
func ExampleStatusOf() {
	for _, c := range []wire.Code{wire.CodeOK, wire.CodeStaleFence, wire.CodeOutcomeUnknown} {
		r := wire.Result{Code: c, Status: wire.StatusOf(c)}
		fmt.Println(c, r.Status, r.Final())
	}
	// Output:
	// ok applied true
	// stale_fence rejected true
	// outcome_unknown unknown false
}

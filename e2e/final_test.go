package e2e

import (
	"testing"

	"github.com/edge-agent/edge-agent/wire"
)

// params whose keys are equal under Unicode case folding are invalid
// (docs/protocol.md §1): a device that matches keys without case would
// take another value than the one the policy judged. Here the range
// policy allows rpm 100 while a generic device would take RPM 5000, at
// the top level and nested; nothing reaches the device, and the same
// command without the folded twin is applied.
func TestCaseFoldedParamKeysAreInvalid(t *testing.T) {
	dir := plugins(t)
	e := newEnv(t, withPolicy(dev("gen-1", "generic"), "range-limit", `{param: rpm, min: 0, max: 3000}`))
	e.extra = "plugins:\n  dir: " + dir + "\n"
	e.start()
	for _, tc := range []struct{ op, params string }{
		{"fold-1", `{"rpm":100,"RPM":5000}`},
		{"fold-2", `{"rpm":100,"cfg":{"mode":"a","Mode":"b"}}`},
		{"fold-3", `{"rpm":100,"steps":[{"k":1,"\u212a":2}]}`}, // U+212A KELVIN SIGN folds to k
	} {
		e.send("gen-1", cmd(tc.op, 1, "set", tc.params))
		r := e.final(tc.op)
		want(t, r, wire.StatusRejected, wire.CodeInvalid)
	}
	e.send("gen-1", cmd("plain-1", 1, "set", `{"rpm":100,"mode":"a"}`))
	want(t, e.final("plain-1"), wire.StatusApplied, wire.CodeOK)
	if ops := e.journalOps(); len(ops) != 1 || ops[0] != "plain-1" {
		t.Fatalf("journal %v: want only plain-1", ops)
	}
}

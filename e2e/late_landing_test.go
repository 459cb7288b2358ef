package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/firmware-sim/sim"
	"github.com/edge-agent/edge-agent/internal/testkit"
)

// An operator's answer cannot let a later write overtake the one it is
// about (invariant 1), with the default resolve_settle. On a device that
// cannot be asked, w1 (fence 5) times out after 300 ms while the firmware
// is still applying it (it lands 2.5 s after it was sent). The operator
// looks at once, sees the old value and answers "not applied"; a newer
// owner's w2 (fence 6) follows. The agent refuses the answer (409, naming
// resolve_settle) until w1 can no longer land; the operator, as
// docs/operations.md says, looks again when the agent accepts, and by
// then sees w1's value. The firmware's journal has w1 before w2.
func TestResolveWaitsUntilTheWriteCannotLand(t *testing.T) {
	d := pump("p")
	d.queryable, d.timeout, d.settle = false, "300ms", "default"
	e := newEnv(t, d)
	e.start()
	if err := e.sim.SetFaults(sim.Faults{Device: "p", LatencyMS: 2500}); err != nil {
		t.Fatal(err)
	}
	e.send("p", cmd("w1", 5, "set", `{"rpm":100}`))
	want(t, e.result("w1", 1), wire.StatusUnknown, wire.CodeOutcomeUnknown)
	e.sim.SetFaults(sim.Faults{}) // w1 is still on its way; w2 will not be delayed

	// The operator: look at the device, answer what it shows, until the
	// agent takes the answer.
	url := "http://" + e.app.AdminAddr() + "/v1/devices/p/ops/w1/resolve"
	refused, answered := 0, ""
	testkit.Eventually(t, 30*time.Second, "the operator's answer taken", func() bool {
		st, err := e.sim.State("p")
		if err != nil {
			t.Fatal(err)
		}
		var s struct{ RPM int }
		json.Unmarshal(st, &s)
		body := `{"applied":false}`
		if s.RPM == 100 {
			body = fmt.Sprintf(`{"applied":true,"state":%s}`, st)
		}
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			answered = body
			return true
		case http.StatusConflict:
			if !strings.Contains(string(b), "resolve_settle") {
				t.Fatalf("refused without saying why: %s", b)
			}
			refused++
			return false
		}
		t.Fatalf("resolve: %d %s", resp.StatusCode, b)
		return false
	})
	if refused == 0 {
		t.Errorf("the answer given while w1 could still land was taken (%s)", answered)
	}
	w1 := e.final("w1")

	e.send("p", cmd("w2", 6, "set", `{"rpm":200}`))
	want(t, e.final("w2"), wire.StatusApplied, wire.CodeOK)
	var j []sim.Entry
	testkit.Eventually(t, 10*time.Second, "both writes in the journal", func() bool {
		j = e.journal()
		return len(j) == 2
	})
	for i := 1; i < len(j); i++ {
		if j[i].Fence < j[i-1].Fence {
			t.Fatalf("fence order broken on the device: %s (fence %d) took effect after %s (fence %d); the operator answered %s (w1 ended %s/%s)",
				j[i].OpID, j[i].Fence, j[i-1].OpID, j[i-1].Fence, answered, w1.Status, w1.Code)
		}
	}
	if w1.Code != wire.CodeOK {
		t.Errorf("w1 landed, yet the answer taken was %s/%s", w1.Status, w1.Code)
	}
	if st, _ := e.sim.State("p"); !strings.Contains(string(st), "200") {
		t.Errorf("the device's state is %s, want w2's rpm 200", st)
	}
}

package failpoint_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/edge-agent/edge-agent/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// A released binary has no failpoints (a production agent must not be
// told by its environment to SIGKILL itself): the code that reads
// EDGE_AGENT_FAILPOINTS is not in it at all. The same build with
// -tags failpoints has it, which shows the check can fail.
func TestReleasedBinaryHasNoFailpoints(t *testing.T) {
	for _, tt := range []struct {
		tags []string
		want bool
	}{{nil, false}, {[]string{"failpoints"}, true}} {
		b, err := os.ReadFile(testkit.Build(t, "../../cmd/edge-agent", tt.tags...))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"EDGE_AGENT_FAILPOINTS", "EDGE_AGENT_CRASH", "SIGKILL at crash point"} {
			if got := bytes.Contains(b, []byte(s)); got != tt.want {
				t.Errorf("tags %v: the binary contains %q: %v, want %v", tt.tags, s, got, tt.want)
			}
		}
	}
}

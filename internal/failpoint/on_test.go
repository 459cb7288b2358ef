//go:build failpoints

package failpoint

import (
	"errors"
	"strings"
	"testing"
)

func TestParseAndFire(t *testing.T) {
	load()
	t.Cleanup(func() { set("") })
	for _, bad := range []string{"nope=crash", "commit", "commit=explode", "commit=error@0", "commit=error%2", "commit=sleep(x)"} {
		if err := set(bad); err == nil {
			t.Errorf("set(%q) accepted", bad)
		}
	}
	if err := set("commit=error@2;after_pending:op-9=crash"); err != nil {
		t.Fatal(err)
	}
	if err := Err(Commit); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	if err := Err(Commit); !errors.Is(err, ErrInjected) || !strings.Contains(err.Error(), "commit") {
		t.Fatalf("second commit: %v, want the injected failure", err)
	}
	if err := Err(Commit); err != nil {
		t.Fatalf("third commit: %v (only the second fails)", err)
	}
	if Armed(AfterPending, "op-1") || !Armed(AfterPending, "op-9") {
		t.Fatal("a crash armed for op-9 only")
	}
	Hit(AfterPending, "op-1") // not armed for op-1: returns
	restore, err := SetFunc(Commit, func() error { return errors.New("disk on fire") })
	if err != nil {
		t.Fatal(err)
	}
	if err := Err(Commit); err == nil || err.Error() != "disk on fire" {
		t.Fatalf("SetFunc: %v", err)
	}
	restore()
	if err := Err(Commit); err != nil {
		t.Fatalf("after restore: %v", err)
	}
}

// set arms the points of spec (the EDGE_AGENT_FAILPOINTS syntax) in
// addition to the environment's; "" clears every point.
func set(spec string) error {
	load()
	if spec == "" {
		state.mu.Lock()
		state.points = map[string][]*action{}
		state.mu.Unlock()
		return nil
	}
	return parse(spec)
}

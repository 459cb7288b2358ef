package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// `make demo` tells the whole story on the embedded defaults, well within a
// minute: the stale controller refused, the replay labelled as the
// recorded output (not as the device's state now), and a write whose
// answer is lost shown unknown, then resolved applied, once in the
// journal.
func TestDemoTellsTheStory(t *testing.T) {
	t.Chdir(t.TempDir()) // run() writes .demo/ in the working directory
	var buf bytes.Buffer
	out = &buf
	defer func() { out = os.Stdout }()
	start := time.Now()
	if err := run(); err != nil {
		t.Fatalf("demo: %v\n%s", err, buf.String())
	}
	if took := time.Since(start); took > time.Minute {
		t.Errorf("the demo took %v", took)
	}
	text := buf.String()
	for _, want := range []string{
		"A: set rpm=3000 (token 41)     -> rejected/stale_fence",
		"A: resend a-1                  -> applied/ok (duplicate: the recorded outcome), last_fence 42, recorded output {\"rpm\":1200} (the pump's state when it was applied, not now)",
		"the pump itself is at {\"rpm\":800} now",
		"rogue: fence 9223372036854775807 -> rejected/unauthorized",
		"B: set rpm=1100 (first Result) -> unknown/outcome_unknown",
		"B: set rpm=1100 (final Result) -> applied/ok, last_fence 42, device state {\"rpm\":1100}",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the demo does not say %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "duplicate: the recorded outcome), last_fence 42, device state") {
		t.Errorf("a replay's output is labelled the device's state:\n%s", text)
	}
	if n := len(regexp.MustCompile(`by op b-6\n`).FindAllString(text, -1)); n != 1 {
		t.Errorf("b-6 is %d times in the journal, want once:\n%s", n, text)
	}
	if !strings.Contains(text, "first Result) -> unknown/outcome_unknown, last_fence 42: the write to pump-7 may or may not have happened") {
		t.Errorf("the unknown Result does not give its reason:\n%s", text)
	}
}

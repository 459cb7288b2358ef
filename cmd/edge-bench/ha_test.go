package main

import (
	"slices"
	"syscall"
	"testing"
	"time"
)

// durStats: the median of an odd count is the middle one, of an even
// count the mean of the middle two; the worst is the largest; over counts
// the runs strictly above the bound. The input is not reordered.
func TestDurStats(t *testing.T) {
	odd := ms(300, 100, 200)
	med, worst, over := durStats(odd, 200*time.Millisecond)
	if med != 200*time.Millisecond || worst != 300*time.Millisecond || over != 1 {
		t.Fatalf("odd: median %s worst %s over %d, want 200ms 300ms 1", med, worst, over)
	}
	if !slices.Equal(odd, ms(300, 100, 200)) {
		t.Fatalf("durStats reordered its input: %v", odd)
	}
	med, worst, over = durStats(ms(400, 100, 300, 200), time.Second)
	if med != 250*time.Millisecond || worst != 400*time.Millisecond || over != 0 {
		t.Fatalf("even: median %s worst %s over %d, want 250ms 400ms 0", med, worst, over)
	}
	if med, worst, over := durStats(nil, time.Second); med != 0 || worst != 0 || over != 0 {
		t.Fatalf("none: %s %s %d", med, worst, over)
	}
}

func TestTakeoverFlags(t *testing.T) {
	d, err := parseDurations(" 3s, 10s,")
	if err != nil || !slices.Equal(d, []time.Duration{3 * time.Second, 10 * time.Second}) {
		t.Fatalf("parseDurations: %v %v", d, err)
	}
	for _, bad := range []string{"", "3", "0s", "-1s", "3s,x"} {
		if _, err := parseDurations(bad); err == nil {
			t.Errorf("parseDurations(%q): no error", bad)
		}
	}
	f, err := parseFaults("kill,stop")
	if err != nil || !slices.Equal(f, []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP}) {
		t.Fatalf("parseFaults: %v %v", f, err)
	}
	for _, bad := range []string{"", "term", "kill,pause"} {
		if _, err := parseFaults(bad); err == nil {
			t.Errorf("parseFaults(%q): no error", bad)
		}
	}
}

package controller

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The lock registry is injectable: a mark in one registry holds
// back an Acquire that shares it, and no other.
func TestRegistryMarksAndIsolation(t *testing.T) {
	a, b := NewRegistry(), NewRegistry()
	a.hold([]string{"locks/x"}, time.Now().Add(time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := a.wait(ctx, []string{"locks/y", "locks/x"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on a marked name: %v, want the context's deadline", err)
	}
	if err := b.wait(context.Background(), []string{"locks/x"}); err != nil {
		t.Fatalf("another registry is held back: %v", err)
	}
	if err := a.wait(context.Background(), []string{"locks/y"}); err != nil {
		t.Fatalf("an unmarked name is held back: %v", err)
	}
	a.hold([]string{"locks/z"}, time.Now().Add(20*time.Millisecond))
	if err := a.wait(context.Background(), []string{"locks/z"}); err != nil {
		t.Fatalf("a mark that runs out: %v", err)
	}
	if o := (*LockOptions)(nil).withDefaults(); o.Registry != DefaultRegistry {
		t.Fatal("nil options do not share the process-wide registry")
	}
}

package controller_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/controller"
)

// The holder loop (docs/controller.md): take the lock that fences a
// device, shut older owners out with a barrier, send fenced commands
// while ownership holds, release. It needs etcd, a broker and an agent,
// so it is compiled, not run; examples/controller is the runnable
// program.
func Example() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:2379"}, DialTimeout: 3 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: "tcp://127.0.0.1:1883", Gateway: "gw-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	h, err := controller.Acquire(ctx, cli, []string{"locks/device/pump-7"}, &controller.LockOptions{
		TTL: 10 * time.Second, AcquireTimeout: 30 * time.Second, Name: "planner-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Release(context.Background())

	s := controller.NewSender(conn, h, nil)
	if err := s.Barrier(ctx, "pump-7"); err != nil {
		log.Fatal(err)
	}
	r, err := s.Send(ctx, "pump-7", "set", map[string]any{"rpm": 1200})
	if errors.Is(err, controller.ErrLost) {
		log.Fatal("a newer owner holds the lock: stop")
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Code, r.Fence == h.Fence())
}

// An operator who already knows the fence sends under a FixedFence; it
// becomes lost, as a Holder does, once a device reports a newer one.
func ExampleFixedFence() {
	f := &controller.FixedFence{Lock: "locks/device/pump-7", Fence: 42, Holder: "ops"}
	fence, _ := f.FenceOf("locks/device/pump-7")
	fmt.Println(fence, f.Check())

	f.Lose(errors.New("pump-7 reported last_fence 43"))
	fmt.Println(errors.Is(f.Check(), controller.ErrLost))
	// Output:
	// 42 <nil>
	// true
}

// Send's errors say what to do next: ErrLost, stop (a newer owner exists);
// ErrOutcomeUnknown, resend with the same op_id to learn the outcome (the
// agent runs an op_id at most once); a *ResultError, the device answered
// and did not apply it. Compiled, not run: it needs a broker and an agent.
func ExampleSender_Send() {
	ctx := context.Background()
	conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: "tcp://127.0.0.1:1883", Gateway: "gw-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	s := controller.NewSender(conn, &controller.FixedFence{Lock: "locks/device/pump-7", Fence: 42, Holder: "ops"}, nil)

	op := controller.NewOpID()
	for {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r, err := s.Send(sctx, "pump-7", "set", map[string]any{"rpm": 1200}, controller.WithOpID(op))
		cancel()
		var rerr *controller.ResultError
		switch {
		case err == nil:
			fmt.Println("applied at fence", r.Fence)
			return
		case errors.Is(err, controller.ErrOutcomeUnknown):
			continue // the same op_id: applied at most once
		case errors.Is(err, controller.ErrLost):
			log.Fatal("a newer owner holds the lock: ", err)
		case errors.As(err, &rerr):
			log.Fatal("not applied: ", r.Code, " ", r.Reason)
		default:
			log.Fatal(err)
		}
	}
}

// A controller's Results come to its own reply topic.
func ExampleReplyTopic() {
	fmt.Println(controller.ReplyTopic("edge", "gw-1", "planner-1"))
	// Output:
	// edge/gw-1/controllers/planner-1/reply
}

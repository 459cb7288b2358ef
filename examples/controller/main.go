// Command controller is a runnable example of the holder loop of
// docs/controller.md: take a lock in etcd, shut older generations out
// with a barrier, do bounded steps that each check ownership and send one
// fenced command, then release.
//
//	go run ./examples/controller --etcd http://127.0.0.1:2379 \
//	    --broker tcp://127.0.0.1:1883 --gateway gw-1 \
//	    --device pump-7 --lock locks/device/pump-7
//
// It needs a running etcd, broker and edge-agent (see README / make demo).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/controller"
)

func main() {
	etcd := flag.String("etcd", "http://127.0.0.1:2379", "etcd endpoints, comma-separated")
	broker := flag.String("broker", "tcp://127.0.0.1:1883", "MQTT broker")
	gateway := flag.String("gateway", "gw-1", "gateway ID")
	device := flag.String("device", "pump-7", "device to drive")
	lock := flag.String("lock", "locks/device/pump-7", "lock that fences the device")
	steps := flag.Int("steps", 5, "how many commands to send")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, strings.Split(*etcd, ","), *broker, *gateway, *device, *lock, *steps); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, endpoints []string, broker, gateway, device, lock string, steps int) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer cli.Close()
	conn, err := controller.Dial(ctx, controller.ConnOptions{Broker: broker, Gateway: gateway})
	if err != nil {
		return err
	}
	defer conn.Close()

	// 1. Acquire: bounded wait, one lease, fence = the lock key's revision.
	h, err := controller.Acquire(ctx, cli, []string{lock}, &controller.LockOptions{
		TTL:            10 * time.Second,
		AcquireTimeout: 30 * time.Second,
		MaxHold:        2 * time.Minute,
		Name:           "example/" + conn.ControllerID(),
		OnState:        func(from, to controller.State) { log.Printf("holder %s -> %s", from, to) },
	})
	if err != nil {
		return err
	}
	// Release only if still the owner; bounded; a LOST holder's release
	// removes nothing of a newer holder.
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := h.Release(rctx); err != nil {
			log.Printf("release: %v", err)
		}
	}()
	log.Printf("ACTIVE with fence %d", h.Fence())

	s := controller.NewSender(conn, h, nil)
	// Work runs under the holder's context: it is cancelled the moment
	// ownership may be lost.
	work, cancel := context.WithCancel(h.Context())
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()

	// 2. Barrier: from now on the device refuses every older generation.
	if err := s.Barrier(work, device); err != nil {
		return err
	}
	// 3. Bounded steps, each checking ownership first.
	for i := 0; i < steps; i++ {
		if err := h.Check(); err != nil {
			return fmt.Errorf("step %d: stopping: %w", i, err)
		}
		// Choosing the op_id up front lets a later resend of the same
		// operation reuse it.
		opID := controller.NewOpID()
		step, cancelStep := context.WithTimeout(work, 10*time.Second)
		r, err := s.Send(step, device, "set", map[string]any{"rpm": 1000 + 100*i}, controller.WithOpID(opID))
		cancelStep()
		switch {
		case errors.Is(err, controller.ErrLost):
			return fmt.Errorf("step %d: lost ownership, stopping (no retry under this fence): %w", i, err)
		case errors.Is(err, controller.ErrOutcomeUnknown):
			return fmt.Errorf("step %d: outcome unknown; resend op_id %s to learn it: %w", i, opID, err)
		case err != nil:
			return fmt.Errorf("step %d: %w", i, err)
		}
		log.Printf("step %d: %s/%s last_fence %d", i, r.Status, r.Code, r.LastFence)
	}
	return nil
}

package main

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/internal/mqtt"
)

// controllers is the load generator's MQTT client: the commands it sends
// carry reply_to = its reply topic, and each final Result (an unknown one
// is not the end) wakes whoever waits for that op_id. Every mode of
// edge-bench (speed, footprint, plugins) sends through one.
type controllers struct {
	cl    paho.Client
	reply string

	mu      sync.Mutex
	waiting map[string]chan struct{}
}

// dialControllers connects as clientID and subscribes to reply, each
// step bounded by timeout.
func dialControllers(broker, clientID, reply string, timeout time.Duration) (*controllers, error) {
	c := &controllers{reply: reply, waiting: map[string]chan struct{}{}}
	o := paho.NewClientOptions().AddBroker(broker).SetClientID(clientID).SetCleanSession(true).
		SetMaxResumePubInFlight(1024).
		SetCustomOpenConnectionFn(mqtt.OpenConnection).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			var r wire.Result
			if json.Unmarshal(m.Payload(), &r) != nil || r.Status == wire.StatusUnknown {
				return
			}
			c.mu.Lock()
			ch := c.waiting[r.OpID]
			delete(c.waiting, r.OpID)
			c.mu.Unlock()
			if ch != nil {
				close(ch)
			}
		})
	c.cl = paho.NewClient(o)
	if tk := c.cl.Connect(); !tk.WaitTimeout(timeout) || tk.Error() != nil {
		return nil, fmt.Errorf("controller connect: %v", tk.Error())
	}
	if tk := c.cl.Subscribe(reply, 1, nil); !tk.WaitTimeout(timeout) || tk.Error() != nil {
		c.cl.Disconnect(100)
		return nil, fmt.Errorf("controller subscribe: %v", tk.Error())
	}
	return c, nil
}

// send publishes payload on topic as the command op and waits up to within
// for its final Result; false when none came.
func (c *controllers) send(op, topic string, payload []byte, within time.Duration) bool {
	done := make(chan struct{})
	c.mu.Lock()
	c.waiting[op] = done
	c.mu.Unlock()
	c.cl.Publish(topic, 1, false, payload)
	select {
	case <-done:
		return true
	case <-time.After(within):
		c.mu.Lock()
		delete(c.waiting, op)
		c.mu.Unlock()
		return false
	}
}

func (c *controllers) close() { c.cl.Disconnect(100) }

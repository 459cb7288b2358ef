package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/wire"
)

// ConnOptions configure Dial.
type ConnOptions struct {
	// Broker URL, e.g. tcp://127.0.0.1:1883. Required.
	Broker string
	// Gateway is the agent's gateway_id. Required.
	Gateway string
	// Prefix is the agent's mqtt.topic_prefix. Zero means "edge".
	Prefix string
	// ControllerID names this controller: its MQTT client ID and its
	// reply topic. Zero means "ctl-" and 8 random hex digits.
	ControllerID string
	// ConnectTimeout bounds Dial's connect and subscribe. Zero means 5s.
	ConnectTimeout time.Duration
	// Username and Password, when the broker needs them.
	Username, Password string
	// MaxReconnectInterval caps the pause between reconnect attempts
	// after the connection was lost (paho doubles it while the broker
	// stays away, and again each time the connection is lost soon after
	// the last loss). Zero means 2s. paho's own default, 10 minutes, kept
	// a controller away from its Results for minutes after a few broker
	// restarts in a row (found by the chaos campaign, docs/testing.md).
	MaxReconnectInterval time.Duration
}

// Conn is a controller's MQTT connection: it publishes commands and
// receives their Results on its own reply topic,
// {prefix}/{gateway}/controllers/{controller-id}/reply (QoS 1), which it
// subscribes again on every reconnect.
type Conn struct {
	opts  ConnOptions
	reply string
	cli   paho.Client

	mu      sync.Mutex
	closed  bool
	waiters map[string]chan wire.Result // by op_id
	dropped int
}

// ReplyTopic returns the controller's reply topic for a gateway.
func ReplyTopic(prefix, gateway, controllerID string) string {
	return prefix + "/" + gateway + "/controllers/" + controllerID + "/reply"
}

// Dial connects to the broker and subscribes to the reply topic; it
// returns once the subscription is confirmed, or ErrConnect (naming the
// broker) when that does not happen within ConnectTimeout or before ctx
// ends.
func Dial(ctx context.Context, opts ConnOptions) (*Conn, error) {
	if opts.Broker == "" || opts.Gateway == "" {
		return nil, fmt.Errorf("%w: broker and gateway are required", ErrConnect)
	}
	if opts.Prefix == "" {
		opts.Prefix = wire.DefaultPrefix
	}
	if opts.ControllerID == "" {
		opts.ControllerID = "ctl-" + randomHex(4)
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = 5 * time.Second
	}
	if opts.MaxReconnectInterval <= 0 {
		opts.MaxReconnectInterval = 2 * time.Second
	}
	c := &Conn{
		opts:    opts,
		reply:   ReplyTopic(opts.Prefix, opts.Gateway, opts.ControllerID),
		waiters: map[string]chan wire.Result{},
	}
	if !wire.ValidPublishTopic(c.reply) {
		return nil, fmt.Errorf("%w: reply topic %q is not valid", ErrConnect, c.reply)
	}
	subscribed := make(chan error, 1)
	po := paho.NewClientOptions().
		AddBroker(opts.Broker).
		SetClientID(opts.ControllerID).
		SetCleanSession(true).
		SetOrderMatters(false).
		SetAutoReconnect(true).
		SetConnectRetry(false).
		SetMaxReconnectInterval(opts.MaxReconnectInterval).
		SetConnectTimeout(opts.ConnectTimeout).
		SetUsername(opts.Username).
		SetPassword(opts.Password).
		SetDefaultPublishHandler(c.onMessage).
		SetOnConnectHandler(func(pc paho.Client) {
			// paho runs this on its own goroutine, so waiting here blocks
			// no message handler.
			tok := pc.Subscribe(c.reply, 1, nil)
			var err error
			if !tok.WaitTimeout(opts.ConnectTimeout) {
				err = fmt.Errorf("subscribe %s: no SUBACK within %v", c.reply, opts.ConnectTimeout)
			} else if err = tok.Error(); err == nil {
				if st, ok := tok.(*paho.SubscribeToken); ok && st.Result()[c.reply] == 0x80 {
					err = fmt.Errorf("subscribe %s: refused by the broker", c.reply)
				}
			}
			select {
			case subscribed <- err:
			default:
			}
		})
	c.cli = paho.NewClient(po)
	tok := c.cli.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, opts.Broker, ctx.Err())
	}
	if err := tok.Error(); err != nil {
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, opts.Broker, err)
	}
	t := time.NewTimer(opts.ConnectTimeout)
	defer t.Stop()
	select {
	case err := <-subscribed:
		if err != nil {
			c.cli.Disconnect(0)
			return nil, fmt.Errorf("%w %s: %w", ErrConnect, opts.Broker, err)
		}
	case <-t.C:
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: reply subscription not confirmed within %v", ErrConnect, opts.Broker, opts.ConnectTimeout)
	case <-ctx.Done():
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, opts.Broker, ctx.Err())
	}
	return c, nil
}

// ReplyTopic is where this controller's Results arrive.
func (c *Conn) ReplyTopic() string { return c.reply }

// ControllerID is this controller's ID.
func (c *Conn) ControllerID() string { return c.opts.ControllerID }

// Close disconnects. It is idempotent.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.cli.Disconnect(250)
	return nil
}

// onMessage routes a Result to the Send awaiting its op_id. It never
// blocks (paho's rule for handlers): a Result nobody can take right now is
// dropped, and Send's resend of the same op_id recovers it.
func (c *Conn) onMessage(_ paho.Client, m paho.Message) {
	if m.Topic() != c.reply || m.Retained() {
		return
	}
	var r wire.Result
	if err := json.Unmarshal(m.Payload(), &r); err != nil || r.OpID == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.waiters[r.OpID]
	if !ok {
		return
	}
	select {
	case ch <- r:
	default:
		c.dropped++
	}
}

func (c *Conn) register(opID string) (<-chan wire.Result, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	if _, dup := c.waiters[opID]; dup {
		return nil, nil, fmt.Errorf("%w: op_id %s is already awaited on this connection", ErrInvalidCommand, opID)
	}
	ch := make(chan wire.Result, 16)
	c.waiters[opID] = ch
	return ch, func() {
		c.mu.Lock()
		delete(c.waiters, opID)
		c.mu.Unlock()
	}, nil
}

func (c *Conn) publish(ctx context.Context, topic string, payload []byte) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	tok := c.cli.Publish(topic, 1, false, payload)
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrPublish, topic, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %s: %w", ErrPublish, topic, ctx.Err())
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}

// NewOpID returns a fresh random op_id (128 random bits): never reused for
// another operation.
func NewOpID() string { return randomHex(16) }

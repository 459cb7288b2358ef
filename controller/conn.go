package controller

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

// ConnOptions configure Dial.
type ConnOptions struct {
	// Broker URL, e.g. tcp://127.0.0.1:1883. Required unless Brokers is
	// set; not both.
	Broker string
	// Brokers are the nodes of one broker cluster: every connection
	// attempt (the first and each one after a loss) tries them in this
	// order and keeps the first that accepts (paho's behaviour), so the
	// Conn moves to the next node when its node is lost. Nil: Broker.
	Brokers []string
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
	// TLS is the client's TLS configuration for an ssl:// (tls://,
	// mqtts://) broker: the CA to trust, a client certificate. Nil means
	// Go's defaults (the system's CAs, no client certificate).
	TLS *tls.Config
	// ResultKey is the gateway's Ed25519 public key (security.result_key_file
	// of the agent): when set, a Result is taken only when it is a JWS
	// signed by it with kid equal to Gateway; anything else arriving as a
	// Result is dropped and counted (Conn.Unverified). Nil: Results are
	// read as they come, plain JSON or the payload of a JWS (unverified).
	ResultKey ed25519.PublicKey
	// MaxReconnectInterval caps the pause between reconnect attempts
	// after the connection was lost (paho doubles it while the broker
	// stays away, and again each time the connection is lost soon after
	// the last loss). Zero means 2s. paho's own default, 10 minutes, kept
	// a controller away from its Results for minutes after a few broker
	// restarts in a row (found by the chaos campaign, docs/testing.md).
	MaxReconnectInterval time.Duration
}

// BrokerURLs are the brokers Dial tries, in order: Brokers, or Broker
// alone.
func (o ConnOptions) BrokerURLs() []string {
	if len(o.Brokers) > 0 {
		return o.Brokers
	}
	if o.Broker == "" {
		return nil
	}
	return []string{o.Broker}
}

// Conn is a controller's MQTT connection: it publishes commands and
// receives their Results on its own reply topic,
// {prefix}/{gateway}/controllers/{controller-id}/reply (QoS 1), which it
// subscribes again on every reconnect.
type Conn struct {
	opts  ConnOptions
	reply string
	cli   paho.Client

	mu         sync.Mutex
	closed     bool
	waiters    map[string]waiter // by op_id
	dropped    int
	unverified int
	foreign    int
	watched    map[string]bool // device result topics subscribed (watchDevice)
	conns      uint64          // connections made (OnConnect runs)
	subErr     error           // the last refused or unanswered SUBSCRIBE
	resubs     int             // SUBSCRIBEs sent again after a refusal
}

// waiter is one Send awaiting the Results of its op_id.
type waiter struct {
	ch     chan wire.Result
	device string
	digest string // wire.PayloadDigest of the published command
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
	if opts.Broker == "" && len(opts.Brokers) == 0 || opts.Gateway == "" {
		return nil, fmt.Errorf("%w: broker and gateway are required", ErrConnect)
	}
	if opts.Broker != "" && len(opts.Brokers) > 0 {
		return nil, fmt.Errorf("%w: set Broker or Brokers, not both", ErrConnect)
	}
	brokers := strings.Join(opts.BrokerURLs(), ",")
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
		waiters: map[string]waiter{},
		watched: map[string]bool{},
	}
	if !wire.ValidPublishTopic(c.reply) {
		return nil, fmt.Errorf("%w: reply topic %q is not valid", ErrConnect, c.reply)
	}
	subscribed := make(chan error, 1)
	po := paho.NewClientOptions()
	for _, b := range opts.BrokerURLs() {
		po.AddBroker(b)
	}
	po.SetClientID(opts.ControllerID).
		SetCleanSession(true).
		SetOrderMatters(false).
		SetAutoReconnect(true).
		SetConnectRetry(false).
		SetMaxReconnectInterval(opts.MaxReconnectInterval).
		SetConnectTimeout(opts.ConnectTimeout).
		SetUsername(opts.Username).
		SetPassword(opts.Password).
		SetTLSConfig(opts.TLS).
		SetDefaultPublishHandler(c.onMessage).
		SetOnConnectHandler(func(pc paho.Client) {
			// paho runs this on its own goroutine, so waiting here blocks
			// no message handler.
			c.subscribeAll(pc, subscribed)
		})
	c.cli = paho.NewClient(po)
	tok := c.cli.Connect()
	select {
	case <-tok.Done():
	case <-ctx.Done():
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, brokers, ctx.Err())
	}
	if err := tok.Error(); err != nil {
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, brokers, err)
	}
	t := time.NewTimer(opts.ConnectTimeout)
	defer t.Stop()
	select {
	case err := <-subscribed:
		if err != nil {
			c.cli.Disconnect(0)
			return nil, fmt.Errorf("%w %s: %w", ErrConnect, brokers, err)
		}
	case <-t.C:
		c.mu.Lock()
		last := c.subErr
		c.closed = true // ends subscribeAll's retries
		c.mu.Unlock()
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: reply subscription not confirmed within %v: %v", ErrConnect, brokers, opts.ConnectTimeout, last)
	case <-ctx.Done():
		c.cli.Disconnect(0)
		return nil, fmt.Errorf("%w %s: %w", ErrConnect, brokers, ctx.Err())
	}
	return c, nil
}

// subscribeAll subscribes the reply topic and the watched device topics
// on a new connection, and again, after a pause (100ms doubling to
// MaxReconnectInterval), for as long as the broker refuses the
// SUBSCRIBE or leaves it unanswered, the connection stays up and is the
// newest one, and the Conn is open: a broker node that has just lost a
// peer may refuse subscriptions for a while (NATS, until JetStream has
// elected new leaders), and without the reply subscription no Result
// would reach this controller on that connection. The first success is
// sent to first (Dial waits for it).
func (c *Conn) subscribeAll(pc paho.Client, first chan<- error) {
	c.mu.Lock()
	c.conns++
	gen := c.conns
	c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		filters := map[string]byte{c.reply: 1}
		c.mu.Lock()
		for t := range c.watched {
			filters[t] = 1
		}
		c.mu.Unlock()
		tok := pc.SubscribeMultiple(filters, nil)
		var err error
		if !tok.WaitTimeout(c.opts.ConnectTimeout) {
			err = fmt.Errorf("subscribe %s: no SUBACK within %v", c.reply, c.opts.ConnectTimeout)
		} else if err = tok.Error(); err == nil {
			if st, ok := tok.(*paho.SubscribeToken); ok {
				for f, q := range st.Result() {
					if q == 0x80 {
						err = fmt.Errorf("subscribe %s: refused by the broker", f)
						break
					}
				}
			}
		}
		if err == nil {
			select {
			case first <- nil:
			default:
			}
			return
		}
		c.mu.Lock()
		c.subErr = err
		stop := c.closed || c.conns != gen
		if !stop {
			c.resubs++
		}
		c.mu.Unlock()
		if stop {
			return
		}
		time.Sleep(Backoff(attempt, 100*time.Millisecond, c.opts.MaxReconnectInterval))
		if !pc.IsConnectionOpen() {
			return // the next connection's OnConnect subscribes
		}
	}
}

// Resubscribes counts the SUBSCRIBEs sent again because the broker had
// refused or not answered one (subscribeAll).
func (c *Conn) Resubscribes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resubs
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
// dropped, and Send's resend of the same op_id recovers it. From a
// device's result topic (watchDevice) only unauthorized Results are
// taken: the agent sends those there and never to reply_to
// (docs/protocol.md §6). An unauthorized Result echoes an op_id the agent
// could not verify, so anyone who may publish on the cmd topic could have
// one sent for another command's op_id: it is taken only when it is about
// the Send's own device and its payload_sha256 names the bytes that Send
// published.
func (c *Conn) onMessage(_ paho.Client, m paho.Message) {
	if m.Retained() {
		return
	}
	onReply := m.Topic() == c.reply
	c.mu.Lock()
	watched := c.watched[m.Topic()]
	c.mu.Unlock()
	if !onReply && !watched {
		return
	}
	payload, ok := c.open(m.Payload())
	if !ok {
		c.mu.Lock()
		c.unverified++
		c.mu.Unlock()
		return
	}
	var r wire.Result
	if err := json.Unmarshal(payload, &r); err != nil || r.OpID == "" {
		return
	}
	if !onReply && r.Code != wire.CodeUnauthorized {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.waiters[r.OpID]
	if !ok {
		return
	}
	if r.Code == wire.CodeUnauthorized && (r.PayloadSHA256 != w.digest || r.Device != w.device ||
		!onReply && m.Topic() != wire.ResultTopic(c.opts.Prefix, c.opts.Gateway, w.device)) {
		c.foreign++
		return
	}
	select {
	case w.ch <- r:
	default:
		c.dropped++
	}
}

// open returns a Result's JSON: with ConnOptions.ResultKey, only from a
// JWS signed by it with kid = the gateway; without, from plain JSON or a
// JWS as it comes.
func (c *Conn) open(payload []byte) ([]byte, bool) {
	if !jws.Looks(payload) {
		return payload, c.opts.ResultKey == nil
	}
	tok, err := jws.Parse(payload)
	if err != nil {
		return nil, false
	}
	if c.opts.ResultKey != nil && (tok.Header.Kid != c.opts.Gateway || tok.Verify(c.opts.ResultKey) != nil) {
		return nil, false
	}
	return tok.Payload, true
}

// Foreign counts the unauthorized Results dropped because they were about
// another message than the one their op_id's Send published (another
// payload, or another device).
func (c *Conn) Foreign() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.foreign
}

// Connected reports whether the connection to the broker is up now; after
// a loss it reconnects by itself (ConnOptions.MaxReconnectInterval).
func (c *Conn) Connected() bool { return c.cli.IsConnectionOpen() }

// Unverified counts the messages dropped because they were not signed by
// ConnOptions.ResultKey (or not a JWS at all).
func (c *Conn) Unverified() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unverified
}

// watchDevice subscribes the device's result topic (once per Conn, and
// again on every reconnect), where an unauthorized Result for one of this
// controller's commands arrives.
func (c *Conn) watchDevice(ctx context.Context, device string) error {
	topic := wire.ResultTopic(c.opts.Prefix, c.opts.Gateway, device)
	c.mu.Lock()
	done := c.watched[topic]
	c.mu.Unlock()
	if done {
		return nil
	}
	tok := c.cli.Subscribe(topic, 1, nil)
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return fmt.Errorf("subscribe %s: %w", topic, err)
		}
	case <-ctx.Done():
		return fmt.Errorf("subscribe %s: %w", topic, ctx.Err())
	}
	c.mu.Lock()
	c.watched[topic] = true
	c.mu.Unlock()
	return nil
}

// register makes the Results of opID, a command for device whose
// published payload has the given wire.PayloadDigest, go to the returned
// channel until the returned func is called.
func (c *Conn) register(opID, device, digest string) (<-chan wire.Result, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, nil, ErrClosed
	}
	if _, dup := c.waiters[opID]; dup {
		return nil, nil, fmt.Errorf("%w: op_id %s is already awaited on this connection", ErrInvalidCommand, opID)
	}
	ch := make(chan wire.Result, 16)
	c.waiters[opID] = waiter{ch: ch, device: device, digest: digest}
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

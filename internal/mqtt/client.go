package mqtt

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// Defaults for the zero values of Options.
const (
	DefaultConnectTimeout = 10 * time.Second
	DefaultKeepAlive      = 30 * time.Second
	DefaultMaxInflight    = 1024
	DefaultCloseTimeout   = 5 * time.Second
	// MaxReconnectInterval caps the backoff between connection attempts,
	// both in Start and in paho's reconnects after a lost connection.
	MaxReconnectInterval = 10 * time.Second
)

const minBackoff = 100 * time.Millisecond

// TLSOptions are PEM files for a TLS connection (ssl:// brokers). The zero
// value means no TLS configuration of ours: an ssl:// broker is then
// verified against the system's roots.
type TLSOptions struct {
	// CAFile holds the CA certificates that verify the broker; "" means
	// the system's roots.
	CAFile string
	// CertFile and KeyFile are the client certificate and its key; both
	// or neither.
	CertFile string
	KeyFile  string
}

// Options configure a Client. Every field says what its zero value means.
type Options struct {
	// Broker is the broker's URL: tcp://host:port or ssl://host:port
	// (also mqtt://, tls://, mqtts://, ws://, wss://). Required unless
	// Brokers is set; not both.
	Broker string
	// Brokers are the nodes of one broker cluster, URLs as Broker. Every
	// connection attempt (the first and each one after a loss) tries them
	// in this order and keeps the first that accepts the client (paho's
	// behaviour), so the client moves to the next node when the one it
	// was on is lost. They must share the session state (a cluster): a
	// node that does not know the persistent session starts a new one.
	// Nil: Broker alone.
	Brokers []string
	// ClientID is the stable client ID of the persistent session.
	// Required: a persistent session needs one.
	ClientID string
	// Username and Password authenticate; "" sends none. A Password needs
	// a Username.
	Username string
	Password string
	// TLS: see TLSOptions; the zero value adds no TLS configuration.
	TLS TLSOptions

	// Subscriptions are topic filters, subscribed at QoS 1 on every
	// (re)connect. Nil: no subscriptions (a publisher).
	Subscriptions []string
	// Handler receives every delivery, in arrival order, on paho's router
	// goroutine: it must not block for long and must not wait for a
	// publish (while it runs, paho reads nothing more from the broker).
	// Every Message must be acked (Message.Ack). It may be called before
	// Start returns: a persistent session's queued messages arrive right
	// after the connection is accepted, before the SUBSCRIBE. Required
	// with Subscriptions; nil acks and drops whatever arrives.
	Handler func(*Message)

	// WillTopic is the retained status topic. "" means no last will and
	// no status messages.
	WillTopic string
	// WillPayload is the last will: the broker publishes it (QoS 1,
	// retained) on WillTopic when the connection ends without a clean
	// DISCONNECT. Required (non-empty) with a WillTopic: mochi-mqtt
	// refuses a CONNECT with an empty will.
	WillPayload []byte
	// OnlinePayload is published (QoS 1, retained) on WillTopic on every
	// connect, once the subscriptions are confirmed. Nil: none.
	//
	// With it, the client also subscribes to WillTopic and publishes
	// OnlinePayload again whenever something else shows up there while it
	// is connected: after a quick reconnect the broker may send the old
	// connection's will after the new connection's online message (both
	// mosquitto and mochi send the will of a connection taken over), which
	// would leave "offline" retained for a client that is online. Messages
	// on WillTopic then never reach Handler.
	OnlinePayload []byte
	// OfflinePayload is published (QoS 1, retained) on WillTopic by Close
	// before it disconnects. Nil: none.
	OfflinePayload []byte

	// ConnectTimeout bounds one connection attempt (TCP, TLS, CONNACK).
	// Zero means DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// KeepAlive is the MQTT keep-alive; the broker declares the client
	// gone (and sends the will) after 1.5 times it without traffic. Zero
	// means DefaultKeepAlive.
	KeepAlive time.Duration
	// MaxInflight bounds the QoS 1 publishes awaiting their PUBACK;
	// PublishAsync waits for room. Zero means DefaultMaxInflight; at most
	// 60000 (MQTT has 65535 packet IDs).
	MaxInflight int
	// CloseTimeout bounds Close's network work (the offline publish and
	// the DISCONNECT). Zero means DefaultCloseTimeout.
	CloseTimeout time.Duration
	// Logger receives connection events. Nil means no logging.
	Logger *slog.Logger
	// MayConnect, when set, is asked before every connection attempt,
	// paho's reconnects included: while it returns false no connection is
	// opened (the attempt fails and is retried with backoff). A standby
	// pair's active that was paused (docs/protocol.md §8) must not, once
	// it wakes, connect with the gateway's client ID and so take the
	// broker session from the agent that took over. Nil: always.
	MayConnect func() bool
}

// ErrMayNotConnect fails a connection attempt that Options.MayConnect
// refused.
var ErrMayNotConnect = errors.New("mqtt: not connecting: Options.MayConnect refused (ha: the session is not proven alive)")

// Client is one persistent MQTT session. Create it with New, then Start
// it once; Close it when done. Its methods are safe for concurrent use.
type Client struct {
	o   Options
	log *slog.Logger

	// lifetime: ctx is cancelled by Close; wg counts Client's own
	// goroutines (the per-connection subscribers); acks has its own.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	acks   *acker

	mu       sync.Mutex
	pc       paho.Client // set by Start
	started  bool
	closed   bool
	closing  bool   // set before the offline publish; no online publish after it
	gen      uint64 // connection generation: bumped by every connect and loss
	ready    chan struct{}
	isReady  bool
	closeErr error

	subscribed atomic.Bool
	// broker is the node of the current or last connection attempt
	// (paho's connection notifications), for logs and Broker.
	broker atomic.Pointer[string]

	// publish window: pubLock (a ctx-aware mutex) guards inflight, the
	// tokens of the publishes not known to be complete, oldest first.
	pubLock  chan struct{}
	inflight []paho.Token
}

// New validates o and returns a Client. It does no I/O.
func New(o Options) (*Client, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.ConnectTimeout == 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.KeepAlive == 0 {
		o.KeepAlive = DefaultKeepAlive
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.CloseTimeout == 0 {
		o.CloseTimeout = DefaultCloseTimeout
	}
	o.Subscriptions = append([]string(nil), o.Subscriptions...)
	o.Brokers = o.servers()
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		o:       o,
		log:     log.With("client_id", o.ClientID),
		ctx:     ctx,
		cancel:  cancel,
		acks:    newAcker(),
		ready:   make(chan struct{}),
		pubLock: make(chan struct{}, 1),
	}, nil
}

func (o *Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidOptions, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Broker == "" && len(o.Brokers) == 0:
		return bad("broker is required")
	case o.Broker != "" && len(o.Brokers) > 0:
		return bad("broker and brokers: set one of them")
	}
	insecure := ""
	for _, b := range o.servers() {
		u, err := url.Parse(b)
		if err != nil {
			return bad("broker %q: %v", b, err)
		}
		switch u.Scheme {
		case "tcp", "mqtt", "ws":
			insecure = b
		case "ssl", "tls", "mqtts", "wss":
		default:
			return bad("broker %q: scheme must be tcp, mqtt, ssl, tls, mqtts, ws or wss", b)
		}
		if u.Host == "" {
			return bad("broker %q: no host", b)
		}
	}
	if o.ClientID == "" {
		return bad("client_id is required (a persistent session needs a stable one)")
	}
	if !utf8.ValidString(o.ClientID) || len(o.ClientID) > 65535 {
		return bad("client_id %q is not a valid MQTT string", o.ClientID)
	}
	if o.Password != "" && o.Username == "" {
		return bad("password without username")
	}
	if (o.TLS.CertFile == "") != (o.TLS.KeyFile == "") {
		return bad("tls: cert_file and key_file go together")
	}
	if o.TLS != (TLSOptions{}) && insecure != "" {
		return bad("tls files are set but broker %q is not ssl://", insecure)
	}
	for _, f := range o.Subscriptions {
		if !ValidFilter(f) {
			return bad("subscription %q is not a valid topic filter", f)
		}
	}
	if len(o.Subscriptions) > 0 && o.Handler == nil {
		return bad("subscriptions need a handler")
	}
	if o.WillTopic != "" && !ValidTopic(o.WillTopic) {
		return bad("will topic %q is not a valid topic", o.WillTopic)
	}
	if o.WillTopic == "" && (o.WillPayload != nil || o.OnlinePayload != nil || o.OfflinePayload != nil) {
		return bad("will, online and offline payloads need a will topic")
	}
	if o.WillTopic != "" && len(o.WillPayload) == 0 {
		return bad("will topic %q needs a will payload", o.WillTopic)
	}
	if o.ConnectTimeout < 0 || o.KeepAlive < 0 || o.CloseTimeout < 0 {
		return bad("timeouts must not be negative")
	}
	if o.KeepAlive != 0 && o.KeepAlive < time.Second {
		return bad("keep_alive must be at least 1s")
	}
	if o.MaxInflight < 0 || o.MaxInflight > 60000 {
		return bad("max_inflight %d is outside 0..60000", o.MaxInflight)
	}
	return nil
}

// servers are the brokers to try, in order.
func (o *Options) servers() []string {
	if len(o.Brokers) > 0 {
		return o.Brokers
	}
	return []string{o.Broker}
}

// brokerList names the brokers for errors.
func (c *Client) brokerList() string { return strings.Join(c.o.Brokers, ",") }

// Broker is the broker of the current connection, or of the last attempt
// while there is none (the first of the list before any).
func (c *Client) Broker() string {
	if b := c.broker.Load(); b != nil {
		return *b
	}
	return c.o.Brokers[0]
}

// ValidTopic reports whether s may be published to: non-empty, UTF-8, at
// most 65535 bytes, no wildcard and no NUL.
func ValidTopic(s string) bool {
	return s != "" && len(s) <= 65535 && utf8.ValidString(s) &&
		!strings.ContainsAny(s, "+#\x00")
}

// ValidFilter reports whether s is a valid subscription filter: like a
// topic, but '+' may fill a whole level and '#' may be the whole last one.
func ValidFilter(s string) bool {
	if s == "" || len(s) > 65535 || !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return false
	}
	levels := strings.Split(s, "/")
	for i, l := range levels {
		if strings.ContainsAny(l, "+#") && len(l) != 1 {
			return false
		}
		if l == "#" && i != len(levels)-1 {
			return false
		}
	}
	return true
}

func (t TLSOptions) config() (*tls.Config, error) {
	if t == (TLSOptions{}) {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt: tls ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("mqtt: tls ca_file %s: no PEM certificate in it", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("mqtt: tls cert_file/key_file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// Start connects, and returns once the client is connected and its
// subscriptions are confirmed (SUBACK), or with an error. While the broker
// cannot be reached it keeps trying, with backoff from 100 ms to 10 s,
// until ctx ends: then it returns ctx's error (wrapped). It returns
// ErrRefused at once when the broker refuses the client for good (bad
// credentials, not authorized, identifier rejected). After a successful
// Start, paho reconnects on its own after any loss of the connection, and
// the subscriptions are renewed on every connect.
//
// Start may be called once. After it returned an error, Close the Client
// (a connection may still complete in the background) and make a new one.
func (c *Client) Start(ctx context.Context) error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return ErrClosed
	case c.started:
		c.mu.Unlock()
		return ErrStarted
	}
	tlsCfg, err := c.o.TLS.config()
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.started = true
	c.pc = paho.NewClient(c.pahoOptions(tlsCfg))
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.acks.run()
	}()
	c.mu.Unlock()

	backoff := minBackoff
	for attempt := 1; ; attempt++ {
		var err error
		if c.mayConnect() {
			tok := c.pc.Connect()
			select {
			case <-tok.Done():
			case <-ctx.Done():
				return fmt.Errorf("mqtt: connect to %s: %w", c.brokerList(), ctx.Err())
			case <-c.ctx.Done():
				return ErrClosed
			}
			if err = tok.Error(); err == nil {
				break
			}
			if ct, ok := tok.(*paho.ConnectToken); ok {
				switch ct.ReturnCode() {
				case packets.ErrRefusedIDRejected, packets.ErrRefusedBadUsernameOrPassword, packets.ErrRefusedNotAuthorised:
					return fmt.Errorf("%w: %s: %v", ErrRefused, c.Broker(), err)
				}
			}
		} else {
			err = ErrMayNotConnect
		}
		c.log.Warn("mqtt: connect failed, retrying", "broker", c.brokerList(), "attempt", attempt, "retry_in", backoff, "error", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("mqtt: connect to %s: %w (last error: %v)", c.brokerList(), ctx.Err(), err)
		case <-c.ctx.Done():
			t.Stop()
			return ErrClosed
		}
		backoff = min(backoff*2, MaxReconnectInterval)
	}

	select {
	case <-c.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mqtt: subscribe on %s: %w", c.Broker(), ctx.Err())
	case <-c.ctx.Done():
		return ErrClosed
	}
}

func (c *Client) pahoOptions(tlsCfg *tls.Config) *paho.ClientOptions {
	po := paho.NewClientOptions()
	// opener is the attempts' opener (nil: paho's own), which a reconnect
	// MayConnect refused swaps for refuseConnection.
	var opener paho.OpenConnectionFunc
	buffer := true
	for _, b := range c.o.Brokers {
		po.AddBroker(b)
		buffer = buffer && buffered(b)
	}
	po.SetClientID(c.o.ClientID).
		SetUsername(c.o.Username).
		SetPassword(c.o.Password).
		SetProtocolVersion(4). // 3.1.1, no silent fallback to 3.1
		SetCleanSession(false).
		SetOrderMatters(true).
		SetAutoAckDisabled(true).
		SetResumeSubs(false). // subscribed again in onConnect instead
		SetAutoReconnect(true).
		SetConnectRetry(false). // Start retries with its own ctx-aware loop
		SetMaxReconnectInterval(MaxReconnectInterval).
		SetConnectTimeout(c.o.ConnectTimeout).
		SetKeepAlive(c.o.KeepAlive).
		// The ordered store resends our unacknowledged publishes in the
		// order they were made after a reconnect (the plain memory
		// store's order is random).
		SetStore(newStore()).
		// Registered before Connect: a persistent session's queued
		// messages may arrive right after CONNACK, before any SUBSCRIBE.
		SetDefaultPublishHandler(c.onMessage).
		SetOnConnectHandler(c.onConnect).
		SetConnectionLostHandler(c.onConnectionLost).
		SetReconnectingHandler(func(_ paho.Client, po *paho.ClientOptions) {
			c.log.Debug("mqtt: reconnecting", "brokers", c.brokerList())
			// paho calls this on its reconnect goroutine right before
			// each attempt, with its own options: the opener chosen
			// here is the one this attempt uses.
			if c.mayConnect() {
				po.CustomOpenConnectionFn = opener
			} else {
				c.log.Info("mqtt: not reconnecting while MayConnect refuses (ha: the session is not proven alive)", "brokers", c.brokerList())
				po.CustomOpenConnectionFn = refuseConnection
			}
		}).
		SetConnectionNotificationHandler(func(_ paho.Client, n paho.ConnectionNotification) {
			switch n := n.(type) {
			case paho.ConnectionNotificationBroker:
				b := n.Broker.String()
				c.broker.Store(&b)
			case paho.ConnectionNotificationBrokerFailed:
				c.log.Debug("mqtt: broker unreachable, trying the next", "broker", n.Broker.String(), "error", n.Reason)
			}
		})
	if c.o.WillTopic != "" {
		po.SetBinaryWill(c.o.WillTopic, c.o.WillPayload, 1, true)
	}
	if tlsCfg != nil {
		po.SetTLSConfig(tlsCfg)
	}
	if buffer {
		// conn.go: fewer system calls. paho has one opener for every
		// broker, so only when all of them are tcp:// or mqtt://.
		opener = OpenConnection
		po.SetCustomOpenConnectionFn(OpenConnection)
	}
	return po
}

// mayConnect is Options.MayConnect's answer (true without one); false
// once Close was called, so a reconnect paho has under way when Close
// runs does not connect.
func (c *Client) mayConnect() bool {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	return !closed && (c.o.MayConnect == nil || c.o.MayConnect())
}

// refuseConnection is the opener of a reconnect that MayConnect refused.
func refuseConnection(*url.URL, paho.ClientOptions) (net.Conn, error) { return nil, ErrMayNotConnect }

// watchesStatus reports whether the client subscribes to its own status
// topic to repair it (see Options.OnlinePayload).
func (c *Client) watchesStatus() bool {
	return c.o.WillTopic != "" && c.o.OnlinePayload != nil
}

// onMessage runs on paho's router goroutine, in arrival order.
func (c *Client) onMessage(_ paho.Client, pm paho.Message) {
	m := &Message{
		Topic:     pm.Topic(),
		Payload:   pm.Payload(),
		Retained:  pm.Retained(),
		Duplicate: pm.Duplicate(),
		QoS:       pm.Qos(),
		PacketID:  pm.MessageID(),
		pm:        pm,
	}
	c.acks.arrive(m)
	if c.watchesStatus() && m.Topic == c.o.WillTopic {
		m.Ack()
		if !m.Retained && !bytes.Equal(m.Payload, c.o.OnlinePayload) {
			c.repairStatus(m.Payload)
		}
		return
	}
	if c.o.Handler == nil {
		c.log.Warn("mqtt: message without a handler, dropped", "topic", m.Topic)
		m.Ack()
		return
	}
	c.o.Handler(m)
}

// onConnect runs in a goroutine of paho's after every connect; the work
// that waits on the broker runs in a goroutine of ours (afterConnect) so
// that Close can stop and wait for it.
func (c *Client) onConnect(pc paho.Client) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.gen++
	gen := c.gen
	c.wg.Add(1)
	c.mu.Unlock()
	c.subscribed.Store(false)
	c.log.Info("mqtt: connected", "broker", c.Broker())
	go func() {
		defer c.wg.Done()
		c.afterConnect(pc, gen)
	}()
}

// repairStatus publishes OnlinePayload again after something else (a late
// will) replaced it while the client is subscribed; from a goroutine, as
// it runs on paho's router goroutine.
func (c *Client) repairStatus(seen []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.closing || !c.subscribed.Load() {
		return
	}
	pc := c.pc
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.mu.Lock()
		if c.closing { // see afterConnect: never online after offline
			c.mu.Unlock()
			return
		}
		tok := pc.Publish(c.o.WillTopic, 1, true, c.o.OnlinePayload)
		c.mu.Unlock()
		c.log.Warn("mqtt: status topic changed while connected, published online again", "topic", c.o.WillTopic, "seen", string(seen))
		select {
		case <-tok.Done():
		case <-c.ctx.Done():
		}
	}()
}

func (c *Client) onConnectionLost(_ paho.Client, err error) {
	c.mu.Lock()
	c.gen++
	c.mu.Unlock()
	c.subscribed.Store(false)
	c.log.Warn("mqtt: connection lost, reconnecting", "broker", c.Broker(), "error", err)
}

func (c *Client) current(gen uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen == gen && !c.closed
}

// filterList is filters' topic filters, sorted and comma-separated, as a
// log line gives them.
func filterList(filters map[string]byte) string {
	return strings.Join(slices.Sorted(maps.Keys(filters)), ",")
}

// afterConnect subscribes (retrying while this connection lasts), marks
// the client subscribed, then publishes OnlinePayload.
func (c *Client) afterConnect(pc paho.Client, gen uint64) {
	backoff := time.Second
	filters := make(map[string]byte, len(c.o.Subscriptions)+1)
	for _, f := range c.o.Subscriptions {
		filters[f] = 1
	}
	if c.watchesStatus() {
		filters[c.o.WillTopic] = 1
	}
	for len(filters) > 0 {
		tok := pc.SubscribeMultiple(filters, nil)
		select {
		case <-tok.Done():
		case <-c.ctx.Done():
			return
		}
		err := tok.Error()
		if err == nil {
			if st, ok := tok.(*paho.SubscribeToken); ok {
				for f, code := range st.Result() {
					if code > 2 {
						err = fmt.Errorf("filter %q refused (SUBACK 0x%02x)", f, code)
						break
					}
				}
			}
		}
		if err == nil {
			break
		}
		if !c.current(gen) {
			return // the connection went; the next onConnect subscribes again
		}
		c.log.Error("mqtt: subscribe failed, retrying", "filters", filterList(filters), "retry_in", backoff, "error", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
		if !c.current(gen) {
			return
		}
		backoff = min(backoff*2, MaxReconnectInterval)
	}

	c.mu.Lock()
	if c.gen != gen || c.closed {
		c.mu.Unlock()
		return
	}
	c.subscribed.Store(true)
	if !c.isReady {
		c.isReady = true
		close(c.ready)
	}
	if len(filters) > 0 {
		c.log.Info("mqtt: subscribed", "filters", filterList(filters))
	}
	if c.o.OnlinePayload == nil || c.closing {
		c.mu.Unlock()
		return
	}
	// Handed to paho under mu, and Close sets closing under mu before its
	// offline publish: so online can never be published after offline.
	tok := pc.Publish(c.o.WillTopic, 1, true, c.o.OnlinePayload)
	c.mu.Unlock()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			c.log.Warn("mqtt: online status publish failed", "topic", c.o.WillTopic, "error", err)
		}
	case <-c.ctx.Done():
	}
}

// Subscribed reports whether the client is connected with its
// subscriptions confirmed by the broker, for readiness. A client without
// subscriptions is "subscribed" once connected.
func (c *Client) Subscribed() bool {
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	return pc != nil && c.subscribed.Load() && pc.IsConnectionOpen()
}

// Connected reports whether the network connection is up right now.
func (c *Client) Connected() bool {
	c.mu.Lock()
	pc := c.pc
	c.mu.Unlock()
	return pc != nil && pc.IsConnectionOpen()
}

// Pending is one QoS 1 publish in flight.
type Pending struct {
	topic string
	tok   paho.Token
}

// Done is closed once the publish is complete: acknowledged by the broker
// (PUBACK) or failed.
func (p *Pending) Done() <-chan struct{} { return p.tok.Done() }

// Err is nil once the broker acknowledged the publish, ErrPending while it
// has not, and the failure otherwise.
func (p *Pending) Err() error {
	select {
	case <-p.tok.Done():
	default:
		return ErrPending
	}
	if err := p.tok.Error(); err != nil {
		return fmt.Errorf("mqtt: publish to %s: %w", p.topic, err)
	}
	return nil
}

// Wait waits for the PUBACK. If ctx ends first it returns ctx's error
// (wrapped); the message stays queued in paho and may still be delivered
// (at least once: it is resent after a reconnect).
func (p *Pending) Wait(ctx context.Context) error {
	select {
	case <-p.tok.Done():
		return p.Err()
	case <-ctx.Done():
		return fmt.Errorf("mqtt: publish to %s: %w", p.topic, ctx.Err())
	}
}

// PublishAsync hands a QoS 1 publish to paho and returns without waiting
// for its PUBACK, so that a publisher can keep many in flight; calls from
// one goroutine are sent in call order. It waits while MaxInflight
// publishes are unacknowledged; if ctx ends while it waits, nothing is
// published and ctx's error is returned (wrapped). While the client is
// reconnecting the message is queued in memory (in order) and sent after
// the reconnect; before the first connection is up it fails at once
// (paho: "not Connected"); a publish still unacknowledged at Close fails.
// It must not be waited for on the Handler's goroutine.
func (c *Client) PublishAsync(ctx context.Context, topic string, payload []byte, retained bool) (*Pending, error) {
	if !ValidTopic(topic) {
		return nil, fmt.Errorf("%w: %q", ErrInvalidTopic, topic)
	}
	c.mu.Lock()
	pc, started, closed := c.pc, c.started, c.closed
	c.mu.Unlock()
	switch {
	case closed:
		return nil, ErrClosed
	case !started:
		return nil, ErrNotStarted
	}
	select {
	case c.pubLock <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("mqtt: publish to %s: %w", topic, ctx.Err())
	case <-c.ctx.Done():
		return nil, ErrClosed
	}
	defer func() { <-c.pubLock }()
	for {
		c.trimInflight()
		if len(c.inflight) < c.o.MaxInflight {
			break
		}
		select {
		case <-c.inflight[0].Done():
		case <-ctx.Done():
			return nil, fmt.Errorf("mqtt: publish to %s: waiting for room in flight: %w", topic, ctx.Err())
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
	}
	tok := pc.Publish(topic, 1, retained, payload)
	c.inflight = append(c.inflight, tok)
	return &Pending{topic: topic, tok: tok}, nil
}

// trimInflight drops completed tokens from the head; pubLock is held.
func (c *Client) trimInflight() {
	for len(c.inflight) > 0 {
		select {
		case <-c.inflight[0].Done():
			c.inflight[0] = nil
			c.inflight = c.inflight[1:]
		default:
			return
		}
	}
}

// Publish publishes at QoS 1 and waits for the PUBACK. If ctx ends first
// it returns ctx's error (wrapped), and the message may or may not be
// delivered later (see Pending.Wait).
func (c *Client) Publish(ctx context.Context, topic string, payload []byte, retained bool) error {
	p, err := c.PublishAsync(ctx, topic, payload, retained)
	if err != nil {
		return err
	}
	return p.Wait(ctx)
}

// ClearRetained deletes the retained message of topic: an empty retained
// publish (QoS 1), waiting for its PUBACK.
func (c *Client) ClearRetained(ctx context.Context, topic string) error {
	return c.Publish(ctx, topic, nil, true)
}

// Close sends the acknowledgements already released by Ack (the others
// are not sent: the broker redelivers those messages to the next session
// with this client ID), publishes OfflinePayload if connected (waiting for
// its PUBACK up to CloseTimeout), disconnects cleanly (so the broker does
// not send the will) and stops the client's goroutines. It also interrupts
// a running Start. Close is idempotent; every other method returns
// ErrClosed after it.
//
// Brokers process a connection's packets in order, so with OfflinePayload
// set the acknowledgements are processed before Close returns. Without
// it, a broker that sees the same client ID connect again before it has
// read the old connection's last packets (mosquitto and mochi both may)
// drops them and redelivers those messages: at least once, as always.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.closeErr
	}
	c.closed = true
	c.closing = true
	pc, started := c.pc, c.started
	c.mu.Unlock()
	c.cancel()
	if !started {
		return nil
	}

	deadline := time.Now().Add(c.o.CloseTimeout)
	var errs []error
	// The released acks are written first; the broker processes a
	// connection's packets in order, so once it has acknowledged the
	// offline publish it has processed them too.
	c.acks.close()
	if c.o.OfflinePayload != nil && pc.IsConnectionOpen() {
		tok := pc.Publish(c.o.WillTopic, 1, true, c.o.OfflinePayload)
		if !tok.WaitTimeout(time.Until(deadline)) {
			errs = append(errs, fmt.Errorf("mqtt: offline status publish: timed out after %s", c.o.CloseTimeout))
		} else if err := tok.Error(); err != nil {
			errs = append(errs, fmt.Errorf("mqtt: offline status publish: %w", err))
		}
	}
	quiesce := max(time.Until(deadline), 100*time.Millisecond)
	if !pc.IsConnectionOpen() {
		// Nothing to flush. paho's Disconnect during a reconnect waits
		// for the attempt's backoff, up to the whole quiesce: a deposed
		// active's stand-down (its reconnects refused by MayConnect)
		// waited CloseTimeout before it could take over again.
		quiesce = 100 * time.Millisecond
	}
	pc.Disconnect(uint(quiesce.Milliseconds()))
	c.wg.Wait()
	c.log.Info("mqtt: closed", "broker", c.Broker())
	c.mu.Lock()
	c.closeErr = errors.Join(errs...)
	c.mu.Unlock()
	return c.closeErr
}

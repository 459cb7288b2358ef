package mqtt

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage/bolt"
	"github.com/mochi-mqtt/server/v2/listeners"
	"go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/edge-agent/edge-agent/internal/mqtt/mosq"
)

// EmbeddedDBFile is the name of the embedded broker's bbolt file in its
// DataDir.
const EmbeddedDBFile = "broker.db"

// EmbeddedOptions configure an Embedded broker.
type EmbeddedOptions struct {
	// Listen is the TCP address of the MQTT listener, e.g.
	// 127.0.0.1:1883. Required. Port 0 picks a free port (see Addr).
	Listen string
	// DataDir holds the broker's state (EmbeddedDBFile: sessions,
	// subscriptions, queued and in-flight QoS 1 messages, retained
	// messages); created if missing. Required.
	DataDir string
	// SyncEveryWrite makes the store fsync every change before mochi goes
	// on: about 1 ms per QoS 1 message routed or acknowledged on an SSD,
	// far more on an SD card. False (the zero value): changes are written
	// to the file at once, so a crash of the process loses nothing, and
	// fsynced every StoreSyncInterval, so an OS crash or power loss loses
	// at most that much (mosquitto's autosave, in configs/mosquitto.conf,
	// is 5 s).
	SyncEveryWrite bool
	// Logger receives mochi-mqtt's log (at Warn: "client store quota
	// reached" and the like). Nil means no logging.
	Logger *slog.Logger

	// The public listener's access rules (embedauth.go).
	//
	// Passwords, when set, makes a client present a user and password
	// from it. Nil: no password file, every client is let in.
	Passwords *mosq.Passwords
	// AllowAnonymous lets clients without a user name in when Passwords
	// is set. False: they are refused.
	AllowAnonymous bool
	// ACL, when set, says who may publish and subscribe where. Nil:
	// everyone everywhere.
	ACL *mosq.ACL
	// TLS, when set, makes the public listener TLS (with client
	// certificates when it requires them). Nil: plain TCP.
	TLS *tls.Config
	// AgentClientID is refused on the public listener: the agent's
	// persistent session is reachable only through its own listener
	// (AgentURL). "": nothing is refused.
	AgentClientID string
}

// StoreSyncInterval is how often the embedded broker's store is fsynced
// when EmbeddedOptions.SyncEveryWrite is false.
const StoreSyncInterval = time.Second

// Embedded is an in-process MQTT broker (mochi-mqtt) for a gateway
// without one: allow-all authentication (bind Listen to loopback),
// persisted under DataDir with mochi's bbolt hook.
//
// Its limits are set so that QoS 1 messages are not dropped for a slow or
// offline persistent subscriber, nor under a burst (mochi's defaults drop
// them once 8192 are unacknowledged or waiting to be written for one
// client):
//
//   - MaximumInflight 65535: mochi has no queue beyond a client's
//     in-flight map, so this is the number of QoS 1 messages it keeps
//     for one session, sent or not, until acknowledged. 65535 is the
//     most MQTT packet identifiers allow: a session with that many
//     unacknowledged messages loses the next ones (counted in Dropped).
//   - MaximumClientWritesPending 65535: the per-client write queue must
//     hold as many messages as the in-flight map, or a burst to a
//     connected client that reads slower than publishers write overflows
//     it ("dropped" instead of queued).
//   - ReceiveMaximum 65535: the inbound QoS window per client.
//   - MaximumMessageExpiryInterval 0: queued and retained messages never
//     expire (mochi's default drops them after a day).
//   - MaximumSessionExpiryInterval: mochi's default, about 136 years, so
//     persistent sessions are kept.
//
// Durability: mochi acknowledges a publish before it stores the copies
// for the subscribers, and the store is fsynced every StoreSyncInterval
// (see EmbeddedOptions.SyncEveryWrite). A message is therefore kept across
// a broker restart or crash once it has been routed, not from the PUBACK
// on, and across a power loss once it has been synced: a controller
// resends until it sees a Result (docs/protocol.md), as it must with
// mosquitto's periodic snapshots too. Order: a publish sent after the
// PUBACK of another, from any connection, is routed after it (see
// sessionHook, fix 4). A store that a power loss left
// inconsistent is moved aside at Start (broker.db.corrupt-<unix time>)
// and the broker starts empty, logging an error: the agent's own store is
// the record that matters, the broker's only holds queued messages.
//
// mochi-mqtt v2.7.9's bbolt hook and its session handling have defects
// that lose or reorder a persistent session's QoS 1 messages; the store
// hook used here works around them (see sessionHook).
type Embedded struct {
	o   EmbeddedOptions
	log *slog.Logger

	mu      sync.Mutex
	srv     *mochi.Server
	tcp     *listeners.TCP
	agent   *listeners.TCP // the agent's own listener (embedauth.go)
	auth    *authHook
	started bool
	closed  bool

	dropped atomic.Int64 // Dropped's value at Close

	syncStop chan struct{} // closed by Close: stops the periodic fsync
	syncDone chan struct{} // closed when it has stopped
}

// NewEmbedded validates o and returns a broker. It does no I/O.
func NewEmbedded(o EmbeddedOptions) (*Embedded, error) {
	if o.Listen == "" {
		return nil, fmt.Errorf("%w: embedded broker: listen is required", ErrInvalidOptions)
	}
	if o.DataDir == "" {
		return nil, fmt.Errorf("%w: embedded broker: data_dir is required", ErrInvalidOptions)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Embedded{o: o, log: log}, nil
}

// minLevel passes on mochi's records at or above min (mochi logs every
// hook, listener and connection at Info), in the agent's words: a
// connection that ends because it was closed (the broker's Close on a
// clean stop, a session taken over) is no warning but a Debug record, and
// a record without a message (mochi's listener logs "" when a connection
// ends with an error) gets one.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "" {
		r.Message = "mqtt: embedded broker: a connection ended"
	}
	closed := false
	r.Attrs(func(a slog.Attr) bool {
		err, ok := a.Value.Any().(error)
		closed = ok && (errors.Is(err, net.ErrClosed) || errors.Is(err, mochi.ErrConnectionClosed))
		return !closed
	})
	if closed {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(a), h.min}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

// EmbeddedCapabilities returns the mochi capabilities Embedded runs with
// (see Embedded); a new value on every call.
func EmbeddedCapabilities() *mochi.Capabilities {
	c := mochi.NewDefaultServerCapabilities() // a fresh copy: never share mochi's default
	c.MaximumInflight = math.MaxUint16
	c.MaximumClientWritesPending = math.MaxUint16
	c.ReceiveMaximum = math.MaxUint16
	c.MaximumMessageExpiryInterval = 0
	c.MaximumSessionExpiryInterval = math.MaxUint32
	return c
}

// Start opens the store (restoring sessions, queued and retained messages)
// and starts listening; it returns once the listener accepts connections.
// ctx only bounds the wait for the store's file lock (another process may
// hold it): Start fails if ctx ends first.
func (e *Embedded) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.closed:
		return ErrClosed
	case e.started:
		return ErrStarted
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mqtt: embedded broker: %w", err)
	}
	if err := os.MkdirAll(e.o.DataDir, 0o750); err != nil {
		return fmt.Errorf("mqtt: embedded broker data_dir: %w", err)
	}
	lockWait := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		lockWait = max(time.Until(d), time.Millisecond)
	}

	path := filepath.Join(e.o.DataDir, EmbeddedDBFile)
	if err := e.checkStore(path, lockWait); err != nil {
		return err
	}
	var (
		fileMu sync.Mutex
		file   *os.File // the store's file as bbolt opened it, for the periodic fsync
	)
	boltOpts := &bbolt.Options{
		Timeout: lockWait,
		NoSync:  !e.o.SyncEveryWrite,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			fileMu.Lock()
			file = f
			fileMu.Unlock()
			return f, err
		},
	}

	srv := mochi.New(&mochi.Options{
		Capabilities: EmbeddedCapabilities(),
		Logger:       slog.New(minLevel{e.log.Handler(), slog.LevelWarn}).With("component", "mochi-mqtt"),
	})
	ah, err := newAuthHook(e.o)
	if err != nil {
		return fmt.Errorf("mqtt: embedded broker auth: %w", err)
	}
	if err := srv.AddHook(ah, nil); err != nil {
		return fmt.Errorf("mqtt: embedded broker auth hook: %w", err)
	}
	store := newSessionHook() // mochi's bolt hook, with fixes (see sessionHook)
	store.srv = srv
	if err := srv.AddHook(store, &bolt.Options{Path: path, Options: boltOpts}); err != nil {
		return fmt.Errorf("mqtt: embedded broker store %s: %w", path, err)
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: e.o.Listen, TLSConfig: e.o.TLS})
	if err := srv.AddListener(tcp); err != nil { // binds
		_ = srv.Close()
		return fmt.Errorf("mqtt: embedded broker listen %s: %w", e.o.Listen, err)
	}
	agent := listeners.NewTCP(listeners.Config{ID: agentListener, Address: "127.0.0.1:0"})
	if err := srv.AddListener(agent); err != nil {
		_ = srv.Close()
		return fmt.Errorf("mqtt: embedded broker, the agent's listener: %w", err)
	}
	if err := srv.Serve(); err != nil { // restores the store, then serves in goroutines
		_ = srv.Close()
		return fmt.Errorf("mqtt: embedded broker: %w", err)
	}
	e.srv, e.tcp, e.agent, e.auth, e.started = srv, tcp, agent, ah, true
	e.syncStop, e.syncDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(e.syncDone)
		if e.o.SyncEveryWrite {
			return
		}
		t := time.NewTicker(StoreSyncInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fileMu.Lock()
				f := file
				fileMu.Unlock()
				if err := f.Sync(); err != nil {
					e.log.Error("mqtt: embedded broker store fsync", "error", err)
				}
			case <-e.syncStop:
				return
			}
		}
	}()
	e.log.Info("mqtt: embedded broker listening", "addr", tcp.Address(), "tls", e.o.TLS != nil,
		"password_file", e.o.Passwords != nil, "acl_file", e.o.ACL != nil, "data", path)
	return nil
}

// checkStore verifies an existing store file and moves it aside if it is
// not a consistent bbolt file (a power loss between two syncs can leave
// it so), so that the broker starts empty instead of failing or crashing
// later. A file locked by another process is an error.
func (e *Embedded) checkStore(path string, lockWait time.Duration) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: lockWait})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return fmt.Errorf("mqtt: embedded broker store %s is locked by another process: %w", path, err)
	}
	if err == nil {
		err = checkBolt(db)
		if cerr := db.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	if err == nil {
		return nil
	}
	aside := fmt.Sprintf("%s.corrupt-%d", path, time.Now().Unix())
	if rerr := os.Rename(path, aside); rerr != nil {
		return fmt.Errorf("mqtt: embedded broker store %s is damaged (%v) and cannot be moved aside: %w", path, err, rerr)
	}
	e.log.Error("mqtt: embedded broker store was damaged; moved aside, starting empty", "path", path, "moved_to", aside, "error", err)
	return nil
}

// checkBolt runs bbolt's consistency check; bbolt panics on some damaged
// pages, which counts as a failed check.
func checkBolt(db *bbolt.DB) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	var errs []error
	if err := db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return nil
	}); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// Addr is the listener's address (host:port, with the port picked for
// port 0), or "" before Start.
func (e *Embedded) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.tcp == nil {
		return ""
	}
	return e.tcp.Address()
}

// URL is the public listener's URL (tcp://Addr(), or ssl:// with TLS);
// "" before Start.
func (e *Embedded) URL() string {
	a := e.Addr()
	switch {
	case a == "":
		return ""
	case e.o.TLS != nil:
		return "ssl://" + a
	}
	return "tcp://" + a
}

// AgentURL is the agent's own listener (tcp://127.0.0.1:PORT), and the
// only credentials it accepts (which may do everything); "" before Start.
func (e *Embedded) AgentURL() (url, username, password string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.agent == nil {
		return "", "", ""
	}
	return "tcp://" + e.agent.Address(), string(e.auth.agentUser), string(e.auth.agentPass)
}

// Dropped counts the QoS 1 messages this broker failed to queue for a
// subscriber (in-flight map or write queue full, packet IDs exhausted).
// Zero is the only good value: export it as a metric.
func (e *Embedded) Dropped() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return e.dropped.Load()
	}
	return atomic.LoadInt64(&e.srv.Info.InflightDropped) + atomic.LoadInt64(&e.srv.Info.MessagesDropped)
}

// Close disconnects every client, waits for their goroutines and closes
// the store. Idempotent; Start after Close returns ErrClosed.
func (e *Embedded) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	if e.srv == nil {
		return nil
	}
	e.dropped.Store(atomic.LoadInt64(&e.srv.Info.InflightDropped) + atomic.LoadInt64(&e.srv.Info.MessagesDropped))
	close(e.syncStop)
	<-e.syncDone
	err := e.srv.Close() // closes listeners, waits for clients, stops hooks (bbolt)
	e.srv = nil
	if err != nil {
		return fmt.Errorf("mqtt: embedded broker close: %w", err)
	}
	if !e.o.SyncEveryWrite { // a last fsync; bbolt's Close does none
		f, err := os.Open(filepath.Join(e.o.DataDir, EmbeddedDBFile))
		if err == nil {
			err = f.Sync()
			_ = f.Close()
		}
		if err != nil {
			return fmt.Errorf("mqtt: embedded broker store fsync: %w", err)
		}
	}
	return nil
}

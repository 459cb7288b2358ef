// Package fencemem keeps a gateway's fence memory beyond its disk
// (docs/protocol.md §7, docs/design.md invariant 7). It recognises when the
// store may not hold every fence the gateway ever accepted for a device (a
// new store, a restored backup, a copy of a stopped store put back, a store
// of another gateway, a device new to this gateway) and then takes the
// fence floor: etcd's current revision R, read linearizably, and
// last_fence = max(last_fence, R) with an audit entry, before any command
// for that device passes. Until then the device's commands are
// fence_unconfirmed. It also holds the gateway's etcd session and, under
// it, the gateway's registration and its devices' claims.
//
// How a doubt is recognised (the argument is in docs/design.md):
//
//   - the store has no identity: a new store;
//   - its identity names another gateway: a store of another gateway;
//   - it carries a backup mark (store.Backup): a restored backup;
//   - its store id or epoch differs from {cp}/stores/{gw} in etcd, which
//     every start that checks in raises together with the store's: a copy
//     put back after the agent ran on (or a store never checked in);
//   - a device has no record, or {cp}/devices/{dev}/store names another
//     store: a device new to this gateway (or fronted elsewhere since).
//
// A doubt is written to the store before anything else, so a restart
// before the floor is taken still knows.
package fencemem

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/store"
)

// The reasons of a floor (docs/protocol.md §7), as recorded in the audit
// entry.
const (
	ReasonNewStore      = "new store"
	ReasonRestored      = "restored store"
	ReasonOtherGateway  = "store of another gateway"
	ReasonNewDevice     = "device new to this gateway"
	ReasonNotRegistered = "store not registered in etcd"
)

// Holder is the holder of every floor's audit entry.
const Holder = "edge-agent (fence floor)"

// Options configure a Memory.
type Options struct {
	// Etcd is the coordination service; nil means none (fences are
	// remembered only by this disk: a warning on a new store).
	Etcd    *config.Etcd
	Gateway string
	Devices []string     // the configured devices
	Store   *store.Store // started
	Version string
	Logger  *slog.Logger     // nil: slog.Default()
	Now     func() time.Time // nil: time.Now
	// Retry is the pause between tries to reach etcd while it is away.
	// Zero means 1s.
	Retry time.Duration
	// HA: agents with this gateway_id on two hosts, one active
	// (docs/protocol.md §8, ha.go); needs Etcd. SafetyMargin is
	// ha.safety_margin.
	HA           bool
	SafetyMargin time.Duration
}

// Memory is one gateway's fence memory.
type Memory struct {
	o   Options
	log *slog.Logger
	id  store.Identity

	confirmed map[string]*atomic.Bool // per configured device

	mu       sync.Mutex
	state    string // off, connected, unreachable
	since    time.Time
	lastErr  string
	rebuilt  *Rebuilt
	onFloor  func(dev string, d store.Device)
	cli      *clientv3.Client
	sess     *concurrency.Session
	failErr  error
	failed   chan struct{}
	failOnce sync.Once

	// The session's proof (ha.go): whether this agent is active (without
	// ha: checked in, its session proven), the active's host while it is
	// standby (ha), the send time of the last confirmed keepalive, and
	// whether the registration was waited for (a takeover, ha).
	active     bool
	activeHost string
	lastSent   time.Time
	waited     bool
	onRole     func(active bool)
	// everActive: the gateway checked in once (without ha, Proven is true
	// before that).
	everActive bool
	// announced is the lease of the session whose standby key is put
	// (announceStandby), 0 when none.
	announced clientv3.LeaseID

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Rebuilt says that etcd's revision is below a fence the store holds: the
// cluster was rebuilt from nothing and every controller's fence is stale
// until it is restored above HighestFence.
type Rebuilt struct {
	Revision     int64  `json:"revision"`
	HighestFence int64  `json:"highest_fence"`
	Device       string `json:"device"`
	Action       string `json:"action"`
}

// Status is the coordination part of GET /v1/status.
type Status struct {
	State       string    `json:"state"`
	Since       time.Time `json:"since,omitzero"`
	StoreID     string    `json:"store_id,omitempty"`
	Epoch       uint64    `json:"epoch,omitempty"`
	Unconfirmed []string  `json:"unconfirmed,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Rebuilt     *Rebuilt  `json:"rebuilt,omitempty"`
}

// New builds a Memory; it does no I/O.
func New(o Options) *Memory {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Retry == 0 {
		o.Retry = time.Second
	}
	if o.Etcd != nil && !o.HA {
		// Without ha the session is proven the same way (lapse), with at
		// most a third of session_ttl as the margin: ha.safety_margin's
		// default (2s) is above that for a short session_ttl.
		if third := o.Etcd.SessionTTL.D() / 3; o.SafetyMargin <= 0 || o.SafetyMargin > third {
			o.SafetyMargin = third
		}
	}
	m := &Memory{o: o, log: o.Logger, confirmed: map[string]*atomic.Bool{}, failed: make(chan struct{}), state: "off"}
	for _, d := range o.Devices {
		m.confirmed[d] = &atomic.Bool{}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m
}

// Confirmed reports whether dev's fences are known complete (its floor is
// taken, or nothing gave cause for doubt): the worker's check before
// stale_fence (docs/protocol.md §1). A device that is not configured is
// not this package's concern.
//
// With coordination it is also false once the session cannot be proven
// alive (Proven): another agent may register as this gateway when it
// expires (a copy of the running gateway, invariant 7), so this one
// confirms nothing until its check-in succeeds again (lapse).
func (m *Memory) Confirmed(dev string) bool {
	if c := m.confirmed[dev]; c != nil {
		return c.Load() && m.Proven()
	}
	return true
}

// Device returns dev's last floor (0: none) and whether its fences are
// confirmed, for GET /v1/devices/{dev}.
func (m *Memory) Device(dev string) (floor int64, confirmed bool) {
	m.o.Store.View(func(tx *store.Tx) error {
		floor = tx.FloorOf(dev)
		return nil
	})
	return floor, m.Confirmed(dev)
}

// OnFloor sets the function told of every floor taken after Start (the
// agent's in-memory last_fence and the device's retained state).
func (m *Memory) OnFloor(fn func(dev string, d store.Device)) {
	m.mu.Lock()
	m.onFloor = fn
	m.mu.Unlock()
}

// Failed is closed when the memory can no longer be kept while running:
// another live agent took this gateway's registration. Err says why; the
// process exits 1.
func (m *Memory) Failed() <-chan struct{} { return m.failed }

// Err is the failure Failed reports.
func (m *Memory) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.failErr
}

func (m *Memory) fail(err error) {
	m.failOnce.Do(func() {
		m.mu.Lock()
		m.failErr = err
		m.mu.Unlock()
		m.log.Error("coordination: stopping", "err", err)
		close(m.failed)
	})
}

// Status returns the coordination state.
func (m *Memory) Status() Status {
	m.mu.Lock()
	s := Status{State: m.state, Since: m.since, Reason: m.lastErr, Rebuilt: m.rebuilt}
	m.mu.Unlock()
	if m.o.Etcd == nil {
		return Status{State: "off"}
	}
	if s.State == "connected" && !m.Proven() {
		// Between the proof's lapse and the next keep-alive tick.
		s.State, s.Reason = "unreachable", "the etcd session could not be proven alive"
	}
	id := m.identity()
	s.StoreID, s.Epoch = id.StoreID, id.Epoch
	for _, d := range m.o.Devices {
		if !m.Confirmed(d) {
			s.Unconfirmed = append(s.Unconfirmed, d)
		}
	}
	sort.Strings(s.Unconfirmed)
	return s
}

func (m *Memory) setID(id store.Identity) {
	m.mu.Lock()
	m.id = id
	m.mu.Unlock()
}

// identity is the store's identity as last checked in.
func (m *Memory) identity() store.Identity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.id
}

func (m *Memory) setState(state, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state != state {
		m.state, m.since = state, m.o.Now().UTC()
	}
	m.lastErr = reason
}

// Start checks the store's memory. Without coordination it only notes
// what it finds (a warning on a new or restored store) and confirms every
// device. With it, it registers the gateway and claims its devices in
// etcd, and takes the floor where the memory may be incomplete, all before
// it returns (so before the broker is connected): ErrClone or ErrClaimed
// when another live agent stands in the way. When etcd cannot be reached
// within dial_timeout, Start returns nil with every device unconfirmed and
// keeps trying in the background.
func (m *Memory) Start(ctx context.Context) error {
	doubts, err := m.local()
	if err != nil {
		return err
	}
	if m.o.Etcd == nil {
		for _, c := range m.confirmed {
			c.Store(true)
		}
		return nil
	}
	m.setState("unreachable", "not yet connected")
	if err := m.connect(); err != nil {
		return err
	}
	if m.o.HA {
		return m.startHA(ctx)
	}
	err = m.checkIn(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrClone), errors.Is(err, ErrClaimed):
		m.Close()
		return err
	}
	m.unreachable(err)
	m.log.Warn("coordination: etcd cannot be reached; commands for every device are rejected fence_unconfirmed until it can (retrying)",
		"endpoints", strings.Join(m.o.Etcd.Endpoints, ","), "doubts", len(doubts), "err", err)
	m.wg.Add(1)
	go m.retry()
	return nil
}

// unreachable records that etcd could not be reached, with what a direct
// dial of each endpoint says (a TLS or connection error is clearer than
// the client's deadline).
func (m *Memory) unreachable(err error) {
	msg := err.Error()
	if d := diagnose(m.o.Etcd); d != "" {
		msg += " (" + d + ")"
	}
	m.setState("unreachable", msg)
}

// local reads the store's identity and records what gives cause for doubt
// (docs/design.md, invariant 7), in one durable transaction: the doubts,
// and the identity with this gateway's name and no backup mark. It returns
// every device in doubt and why.
func (m *Memory) local() (map[string]string, error) {
	var doubts map[string]string
	var whole string
	err := m.o.Store.Update(context.Background(), func(tx *store.Tx) error {
		id, ok := tx.Identity()
		switch {
		case !ok:
			whole = ReasonNewStore
			id = store.Identity{StoreID: store.NewStoreID()}
		case id.Gateway != "" && id.Gateway != m.o.Gateway:
			whole = fmt.Sprintf("%s (%s)", ReasonOtherGateway, id.Gateway)
		case id.Backup != "":
			whole = fmt.Sprintf("%s (%s)", ReasonRestored, id.Backup)
		}
		id.Gateway, id.Backup = m.o.Gateway, ""
		m.setID(id)
		if err := tx.PutIdentity(id); err != nil {
			return err
		}
		doubts = tx.Doubts()
		if m.o.Etcd == nil {
			return nil
		}
		add := map[string]string{}
		stored, err := tx.StoredDevices()
		if err != nil {
			return err
		}
		for _, dev := range union(stored, m.o.Devices) {
			if whole != "" {
				add[dev] = whole
				continue
			}
			if _, has, err := tx.Device(dev); err != nil {
				return err
			} else if !has {
				add[dev] = ReasonNewDevice
			}
		}
		return m.putDoubts(tx, doubts, add)
	})
	if err != nil {
		return nil, err
	}
	if m.o.Etcd == nil && whole != "" {
		m.log.Warn("fences are remembered only by this disk: "+whole+"; a controller of an older generation would be accepted again. Configure coordination.etcd, or raise the fences with `edge-agent fence floor` (docs/operations.md)",
			"store", m.o.Store.Path())
	}
	return doubts, nil
}

// putDoubts adds add's doubts to doubts (an earlier reason stays) and
// writes the new ones.
func (m *Memory) putDoubts(tx *store.Tx, doubts, add map[string]string) error {
	for dev, why := range add {
		if _, has := doubts[dev]; has {
			continue
		}
		doubts[dev] = why
		if err := tx.PutDoubt(dev, why); err != nil {
			return err
		}
	}
	return nil
}

func union(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(append([]string{}, a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

func (m *Memory) connect() error {
	e := m.o.Etcd
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: e.DialTimeout.D(),
		Username: e.Username, Password: e.Password, TLS: e.TLSConfig, Logger: zap.NewNop(),
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: 3 * time.Second})
	if err != nil {
		return fmt.Errorf("%w: coordination.etcd: %v", config.ErrInvalid, err)
	}
	m.cli = cli
	return nil
}

func (m *Memory) key(parts ...string) string {
	return m.o.Etcd.Prefix + "/" + strings.Join(parts, "/")
}

// registration is {cp}/gateways/{gw}; a standby's {cp}/standbys/{gw}/{lease}
// is the same without store_id.
type registration struct {
	Gateway   string    `json:"gateway"`
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Version   string    `json:"version"`
	StoreID   string    `json:"store_id,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Role (extension, docs/protocol.md §8): "single" without ha, else
	// "active" (in {cp}/gateways/{gw}) or "standby" (in {cp}/standbys/).
	Role string `json:"role,omitempty"`
}

// storeRecord is {cp}/stores/{gw}: the store that last checked in as the
// gateway, and its epoch then.
type storeRecord struct {
	StoreID string `json:"store_id"`
	Epoch   uint64 `json:"epoch"`
}

// checkIn is everything Start needs etcd for: the session, the
// registration and the claims (waiting up to session_ttl for a key left by
// a session that ended without closing), the identity check, and the
// floor for every device in doubt.
func (m *Memory) checkIn(ctx context.Context) error {
	e := m.o.Etcd
	dctx, cancel := context.WithTimeout(ctx, e.DialTimeout.D())
	defer cancel()
	if _, err := m.cli.Get(dctx, m.key("gateways", m.o.Gateway)); err != nil {
		return fmt.Errorf("etcd %s: %w", strings.Join(e.Endpoints, ","), err)
	}
	sess, err := concurrency.NewSession(m.cli, concurrency.WithTTL(int(e.SessionTTL.D()/time.Second)), concurrency.WithContext(m.ctx))
	if err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	if err := m.register(ctx, sess); err != nil {
		sess.Close()
		return err
	}
	m.mu.Lock()
	m.sess = sess
	m.mu.Unlock()
	sent := time.Now()
	{
		// The grant may be long past (a standby waits under it, and any
		// agent waits here for the keys of its own ended session): the
		// session is proven from a keepalive sent now.
		kctx, cancel := context.WithTimeout(ctx, e.DialTimeout.D())
		_, err := m.cli.KeepAliveOnce(kctx, sess.Lease())
		cancel()
		if err != nil {
			m.mu.Lock()
			m.sess = nil
			m.mu.Unlock()
			sess.Close()
			return fmt.Errorf("etcd keepalive: %w", err)
		}
	}
	if err := m.confirm(ctx); err != nil {
		// The registration and claims go with the session, so the next
		// try (a new session) does not take them for a live clone's.
		m.mu.Lock()
		m.sess = nil
		m.mu.Unlock()
		sess.Close()
		return err
	}
	m.setState("connected", "")
	m.becomeActive(sess, sent)
	return nil
}

// register creates {cp}/gateways/{gw} and {cp}/devices/{dev}/gateway
// under sess. A key held by another lease is waited for up to
// session_ttl + 1s (the session of a crashed run of this agent expires in
// that time); one still held then belongs to a live agent.
func (m *Memory) register(ctx context.Context, sess *concurrency.Session) error {
	host, _ := os.Hostname()
	reg := registration{Gateway: m.o.Gateway, Host: host, PID: os.Getpid(), Version: m.o.Version,
		StoreID: m.identity().StoreID, StartedAt: m.o.Now().UTC(), Role: RoleSingle}
	if m.o.HA {
		reg.Role = RoleActive
	}
	b, _ := json.Marshal(reg)
	deadline := time.Now().Add(m.o.Etcd.SessionTTL.D() + time.Second)
	gwDeadline := deadline
	if m.o.HA {
		gwDeadline = time.Now().Add(100 * 365 * 24 * time.Hour) // a standby waits
	}
	gwKey := m.key("gateways", m.o.Gateway)
	var other string
	ok, err := m.claim(ctx, sess, gwKey, string(b), gwDeadline, func(cur string) bool {
		var r registration
		json.Unmarshal([]byte(cur), &r)
		other = fmt.Sprintf("host %s, pid %d, started %s", r.Host, r.PID, r.StartedAt.Format(time.RFC3339))
		if m.o.HA {
			m.mu.Lock()
			m.waited = true
			m.mu.Unlock()
			m.standbyOf(cur)
			m.announceStandby(ctx, sess, reg)
		}
		return false
	})
	if m.o.HA {
		m.unannounceStandby(ctx, sess)
	}
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: gateway %s is registered in etcd (%s) by a live agent: %s. A copied image or two configurations with one gateway_id; this one exits",
			ErrClone, m.o.Gateway, gwKey, other)
	}
	var claimed []string
	for _, dev := range m.o.Devices {
		k := m.key("devices", dev, "gateway")
		var by string
		ok, err := m.claim(ctx, sess, k, m.o.Gateway, deadline, func(cur string) bool {
			by = cur
			return cur == m.o.Gateway // this gateway's own claim of an ended session
		})
		if err != nil {
			return err
		}
		if !ok {
			claimed = append(claimed, fmt.Sprintf("device %s is fronted by live gateway %s", dev, by))
		}
	}
	if len(claimed) > 0 {
		return fmt.Errorf("%w: gateway %s cannot claim them: %s (move a device only after its old gateway let it go: removed from its config and restarted, or stopped)",
			ErrClaimed, m.o.Gateway, strings.Join(claimed, "; "))
	}
	return nil
}

// claim puts key = val under sess when the key is absent (or mine says
// the current value may be taken over), waiting until deadline for
// another lease's key to go. ok is false when it is still held then.
func (m *Memory) claim(ctx context.Context, sess *concurrency.Session, key, val string, deadline time.Time, mine func(cur string) bool) (bool, error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, m.o.Etcd.DialTimeout.D())
		resp, err := m.cli.Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(sess.Lease()))).
			Else(clientv3.OpGet(key)).Commit()
		cancel()
		if err != nil {
			return false, fmt.Errorf("etcd: claiming %s: %w", key, err)
		}
		if resp.Succeeded {
			return true, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		kv := kvs[0]
		if clientv3.LeaseID(kv.Lease) == sess.Lease() {
			return true, nil
		}
		if mine(string(kv.Value)) {
			cctx, cancel := context.WithTimeout(ctx, m.o.Etcd.DialTimeout.D())
			r, err := m.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
				Then(clientv3.OpPut(key, val, clientv3.WithLease(sess.Lease()))).Commit()
			cancel()
			if err != nil {
				return false, fmt.Errorf("etcd: claiming %s: %w", key, err)
			}
			if r.Succeeded {
				return true, nil
			}
			continue
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// confirm compares the store's identity with etcd's records, writes every
// doubt it finds with the store's new epoch, checks the epoch in to etcd,
// and takes the floor for every device in doubt.
func (m *Memory) confirm(ctx context.Context) error {
	e := m.o.Etcd
	cctx, cancel := context.WithTimeout(ctx, e.DialTimeout.D()+5*time.Second)
	defer cancel()
	stKey := m.key("stores", m.o.Gateway)
	ops := []clientv3.Op{clientv3.OpGet(stKey)}
	for _, dev := range m.o.Devices {
		ops = append(ops, clientv3.OpGet(m.key("devices", dev, "store")))
	}
	var resps []*clientv3.TxnResponse
	for i := 0; i < len(ops); i += 100 {
		r, err := m.cli.Txn(cctx).Then(ops[i:min(i+100, len(ops))]...).Commit()
		if err != nil {
			return fmt.Errorf("etcd: reading %s: %w", stKey, err)
		}
		resps = append(resps, r)
	}
	get := func(i int) []byte {
		kvs := resps[i/100].Responses[i%100].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return nil
		}
		return kvs[0].Value
	}
	var stModRev int64
	if kvs := resps[0].Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		stModRev = kvs[0].ModRevision
	}
	var whole string
	var rec storeRecord
	id := m.identity()
	switch raw := get(0); {
	case raw == nil:
		whole = ReasonNotRegistered
	case json.Unmarshal(raw, &rec) != nil:
		whole = ReasonNotRegistered
	case m.o.HA && (m.tookOver() || rec.StoreID != id.StoreID):
		// The other agent of the pair was active since this store checked
		// in: it may have accepted fences this store never saw.
		whole = ReasonTakeover
	case rec.StoreID != id.StoreID:
		whole = fmt.Sprintf("%s (etcd knows store %s for gateway %s, this is store %s)", ReasonRestored, rec.StoreID, m.o.Gateway, id.StoreID)
	case rec.Epoch != id.Epoch:
		whole = fmt.Sprintf("%s (store epoch %d, etcd's %d: an older copy)", ReasonRestored, id.Epoch, rec.Epoch)
	}
	add := map[string]string{}
	for i, dev := range m.o.Devices {
		switch s := get(i + 1); {
		case whole != "":
			add[dev] = whole
		case string(s) != id.StoreID:
			add[dev] = ReasonNewDevice
		}
	}
	var doubts map[string]string
	next := id
	next.Epoch++
	err := m.o.Store.Update(context.Background(), func(tx *store.Tx) error {
		doubts = tx.Doubts()
		if whole != "" {
			stored, err := tx.StoredDevices()
			if err != nil {
				return err
			}
			for _, dev := range stored {
				add[dev] = whole
			}
		}
		if err := m.putDoubts(tx, doubts, add); err != nil {
			return err
		}
		if whole == ReasonTakeover {
			// A takeover is named even where another doubt was already
			// recorded (a standby's new store).
			for dev, why := range doubts {
				if !strings.HasPrefix(why, ReasonTakeover) {
					doubts[dev] = fmt.Sprintf("%s (%s)", ReasonTakeover, why)
					if err := tx.PutDoubt(dev, doubts[dev]); err != nil {
						return err
					}
				}
			}
		}
		return tx.PutIdentity(next)
	})
	if err != nil {
		return err
	}
	for dev := range doubts {
		if c := m.confirmed[dev]; c != nil {
			c.Store(false)
		}
	}
	m.setID(next)
	b, _ := json.Marshal(storeRecord{StoreID: next.StoreID, Epoch: next.Epoch})
	resp, err := m.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(stKey), "=", stModRev)).
		Then(clientv3.OpPut(stKey, string(b))).Commit()
	if err != nil {
		return fmt.Errorf("etcd: writing %s: %w", stKey, err)
	}
	if !resp.Succeeded {
		return ErrRaced
	}
	return m.floor(cctx, doubts)
}

// floor reads etcd's revision linearizably and takes the floor for every
// device in doubt, then records in etcd that this store fronts the
// configured devices and confirms them.
func (m *Memory) floor(ctx context.Context, doubts map[string]string) error {
	resp, err := m.cli.Get(ctx, m.key("stores", m.o.Gateway))
	if err != nil {
		return fmt.Errorf("etcd: reading the revision: %w", err)
	}
	rev := resp.Header.Revision
	var hdev string
	var high int64
	taken := map[string]store.Device{}
	devs := make([]string, 0, len(doubts))
	for dev := range doubts {
		devs = append(devs, dev)
	}
	sort.Strings(devs)
	err = m.o.Store.Update(context.Background(), func(tx *store.Tx) error {
		var err error
		if hdev, high, err = tx.HighestFence(); err != nil {
			return err
		}
		for _, dev := range devs {
			d, _, err := tx.TakeFloor(dev, rev, Holder, doubts[dev], m.o.Now())
			if err != nil {
				return err
			}
			taken[dev] = d
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.rebuilt = nil
	if high > rev {
		m.rebuilt = &Rebuilt{Revision: rev, HighestFence: high, Device: hdev,
			Action: fmt.Sprintf("etcd's revision %d is below the highest fence this store holds (%d, %s): the cluster was rebuilt and every controller's fence is stale; restore it with `etcdutl snapshot restore --bump-revision %d` (docs/operations.md)", rev, high, hdev, high-rev+1000)}
	}
	fn, rb := m.onFloor, m.rebuilt
	m.mu.Unlock()
	if rb != nil {
		m.log.Error("coordination: "+rb.Action, "revision", rev, "highest_fence", high, "device", hdev)
	}
	for _, dev := range devs {
		m.log.Warn("fence floor taken: every older generation of controllers is now stale_fence; the holder takes a new lock and sends a barrier",
			"device", dev, "floor", rev, "last_fence", taken[dev].LastFence, "reason", doubts[dev])
		if fn != nil {
			fn(dev, taken[dev])
		}
	}
	var ops []clientv3.Op
	for _, dev := range m.o.Devices {
		ops = append(ops, clientv3.OpPut(m.key("devices", dev, "store"), m.identity().StoreID))
	}
	for i := 0; i < len(ops); i += 100 {
		if _, err := m.cli.Txn(ctx).Then(ops[i:min(i+100, len(ops))]...).Commit(); err != nil {
			return fmt.Errorf("etcd: recording the devices' store: %w", err)
		}
	}
	for _, c := range m.confirmed {
		c.Store(true)
	}
	return nil
}

// retry keeps trying to check in while etcd is away.
func (m *Memory) retry() {
	defer m.wg.Done()
	if m.checkInAgain(true) {
		id := m.identity()
		m.log.Info("coordination: etcd reached; fence memory confirmed", "store_id", id.StoreID, "epoch", id.Epoch)
	}
}

// Close ends the session (its keys go at once) and the client.
func (m *Memory) Close() {
	m.cancel()
	m.wg.Wait()
	m.mu.Lock()
	sess, cli := m.sess, m.cli
	m.sess, m.cli = nil, nil
	m.mu.Unlock()
	if sess != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cli.Revoke(ctx, sess.Lease())
		cancel()
	}
	if cli != nil {
		cli.Close()
	}
}

// diagnose dials each endpoint directly (TCP, then TLS for https://) and
// says what fails, "" when every endpoint answers.
func diagnose(e *config.Etcd) string {
	var out []string
	for _, ep := range e.Endpoints {
		u, err := url.Parse(ep)
		if err != nil {
			continue
		}
		c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", ep, err))
			continue
		}
		if u.Scheme == "https" && e.TLSConfig != nil {
			tc := e.TLSConfig.Clone()
			tc.ServerName, _, _ = net.SplitHostPort(u.Host)
			t := tls.Client(c, tc)
			t.SetDeadline(time.Now().Add(2 * time.Second))
			if err := t.Handshake(); err != nil {
				out = append(out, fmt.Sprintf("%s: TLS: %v", ep, err))
			}
		}
		c.Close()
	}
	return strings.Join(out, "; ")
}

// tookOver reports whether the registration was waited for: another agent
// was active.
func (m *Memory) tookOver() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waited
}

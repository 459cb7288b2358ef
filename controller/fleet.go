package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/controller/wire"
)

// DefaultDirectoryPrefix is the agent's default coordination.etcd.prefix,
// under which its device directory lives.
const DefaultDirectoryPrefix = "edge"

// ErrNoGateway is returned by LookupGateway (and FleetSender.Send) when no
// live gateway claims the device in the directory: none is configured
// with it, or the one that is has stopped (its claim ends with its etcd
// session).
var ErrNoGateway = errors.New("controller: no live gateway claims the device")

// LookupGateway returns the gateway that fronts dev, from the device
// directory the agents keep in etcd: {prefix}/devices/{dev}/gateway, the
// gateway_id, written by the agent that has dev configured while its etcd
// session lives (docs/protocol.md §7, §9). prefix is the agents'
// coordination.etcd.prefix; "" means DefaultDirectoryPrefix. The read is
// linearizable.
func LookupGateway(ctx context.Context, cli *clientv3.Client, prefix, dev string) (string, error) {
	if prefix == "" {
		prefix = DefaultDirectoryPrefix
	}
	if !wire.ValidDeviceID(dev) {
		return "", fmt.Errorf("%w: device %q", ErrInvalidCommand, dev)
	}
	resp, err := cli.Get(ctx, prefix+"/devices/"+dev+"/gateway")
	if err != nil {
		return "", fmt.Errorf("controller: device directory: %w", err)
	}
	if len(resp.Kvs) == 0 || !wire.ValidDeviceID(string(resp.Kvs[0].Value)) {
		return "", fmt.Errorf("%w: device %s (%s/devices/%s/gateway)", ErrNoGateway, dev, prefix, dev)
	}
	return string(resp.Kvs[0].Value), nil
}

// FleetSender sends commands under one Owner to devices on any gateway of
// a fleet: each Send looks the device's gateway up in the directory
// (LookupGateway, so a device moved to another gateway is followed) and
// goes through a Sender of that gateway, on a Conn dialled the first time
// it is needed and kept until Close. Sends to one device are serialised as
// a Sender's are. It is safe for concurrent use.
type FleetSender struct {
	cli    *clientv3.Client
	prefix string
	conn   ConnOptions
	owner  Owner
	opts   *SendOptions

	mu      sync.Mutex
	closed  bool
	conns   map[string]*Conn
	senders map[string]*Sender
	dialing map[string]chan struct{} // closed when that gateway's Dial ended
}

// NewFleetSender returns a FleetSender. conn is the template of every
// gateway's Conn: its Gateway is ignored (each Conn gets its gateway's),
// and a ControllerID, when set, gets "-" and the gateway appended (each
// Conn is its own MQTT client). prefix is the directory's (as
// LookupGateway). It does no I/O.
func NewFleetSender(cli *clientv3.Client, prefix string, conn ConnOptions, owner Owner, opts *SendOptions) *FleetSender {
	if prefix == "" {
		prefix = DefaultDirectoryPrefix
	}
	return &FleetSender{cli: cli, prefix: prefix, conn: conn, owner: owner, opts: opts,
		conns: map[string]*Conn{}, senders: map[string]*Sender{}, dialing: map[string]chan struct{}{}}
}

// Send looks up the device's gateway and sends as Sender.Send does; it
// returns ErrNoGateway when no live gateway claims the device, and
// ErrConnect when that gateway's Conn cannot be dialled.
func (f *FleetSender) Send(ctx context.Context, device, action string, params any, opts ...CallOption) (wire.Result, error) {
	gw, err := LookupGateway(ctx, f.cli, f.prefix, device)
	if err != nil {
		return wire.Result{}, err
	}
	s, err := f.sender(ctx, gw)
	if err != nil {
		return wire.Result{}, err
	}
	return s.Send(ctx, device, action, params, opts...)
}

// Gateway is the Sender of one gateway (dialling its Conn if needed), for
// what FleetSender does not route itself (a Barrier of that gateway's
// devices, its Stats).
func (f *FleetSender) Gateway(ctx context.Context, gateway string) (*Sender, error) {
	return f.sender(ctx, gateway)
}

func (f *FleetSender) sender(ctx context.Context, gw string) (*Sender, error) {
	for {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return nil, ErrClosed
		}
		if s := f.senders[gw]; s != nil {
			f.mu.Unlock()
			return s, nil
		}
		wait, busy := f.dialing[gw]
		if !busy {
			done := make(chan struct{})
			f.dialing[gw] = done
			f.mu.Unlock()
			s, err := f.dial(ctx, gw)
			f.mu.Lock()
			delete(f.dialing, gw)
			close(done)
			f.mu.Unlock()
			return s, err
		}
		f.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w %s: %w", ErrConnect, gw, ctx.Err())
		}
	}
}

func (f *FleetSender) dial(ctx context.Context, gw string) (*Sender, error) {
	co := f.conn
	co.Gateway = gw
	if co.ControllerID != "" {
		co.ControllerID += "-" + gw
	}
	c, err := Dial(ctx, co)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		c.Close()
		return nil, ErrClosed
	}
	s := NewSender(c, f.owner, f.opts)
	f.conns[gw], f.senders[gw] = c, s
	return s, nil
}

// Close closes every Conn. It is idempotent.
func (f *FleetSender) Close() error {
	f.mu.Lock()
	f.closed = true
	conns := f.conns
	f.conns, f.senders = map[string]*Conn{}, map[string]*Sender{}
	f.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

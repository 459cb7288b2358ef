package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

// fleetGateway is one gateway of `edgectl fleet`.
type fleetGateway struct {
	Gateway string `json:"gateway"`
	// Registered: an agent holds {cp}/gateways/{gw} now (its etcd session
	// lives); Host, PID, Version and StartedAt are that registration's.
	Registered bool      `json:"registered"`
	Host       string    `json:"host,omitempty"`
	PID        int       `json:"pid,omitempty"`
	Version    string    `json:"version,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	// Role of the agent holding the registration: "single" (no ha) or
	// "active" (ha; an agent from before the registration said its role
	// shows "active" too); without a registration, the role its status
	// topic names while online; "" when none.
	Role string `json:"role,omitempty"`
	// Standbys are the agents waiting to take over ({cp}/standbys/{gw}/):
	// with Role "active", Host and PID say which host is active.
	Standbys []fleetStandby `json:"standbys,omitempty"`
	// Status is the retained status topic's state (online, offline), ""
	// without --broker or when the topic holds none.
	Status string `json:"status,omitempty"`
	Online bool   `json:"online"`
	// HeldWrites is the sum of the devices' held_writes (0 without
	// --broker: the retained DeviceStates carry them).
	HeldWrites int           `json:"held_writes"`
	Devices    []fleetDevice `json:"devices"`
}

// fleetStandby is an agent waiting as standby for a gateway.
type fleetStandby struct {
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Version   string    `json:"version,omitempty"`
	StartedAt time.Time `json:"started_at,omitzero"`
}

// fleetDevice is one device of a gateway: claimed in the directory, or
// with a retained DeviceState.
type fleetDevice struct {
	Device    string          `json:"device"`
	Claimed   bool            `json:"claimed"` // {cp}/devices/{dev}/gateway names this gateway now
	LastFence int64           `json:"last_fence"`
	LastOpID  string          `json:"last_op_id,omitempty"`
	State     json.RawMessage `json:"state,omitempty"`
	At        time.Time       `json:"at,omitzero"`
	// HeldWrites: the retained DeviceState's held_writes, the device's
	// writes whose outcome is unknown, held until the device answers or
	// an operator resolves them (GET /v1/ops?status=unknown on its
	// gateway lists them).
	HeldWrites int `json:"held_writes"`
}

func fleetCmd() *cobra.Command {
	var mf mqttFlags
	var etcd, dirPrefix, prefix string
	var asJSON bool
	var wait time.Duration
	c := &cobra.Command{
		Use:   "fleet",
		Short: "List every gateway of a fleet and its devices",
		Long: `List every gateway that coordinates through one etcd cluster: the ones
registered now ({prefix}/gateways/{gw}: host, pid, version, started_at,
role: single, or active with its standbys) and the ones that ran before
({prefix}/stores/{gw}); with --broker, whether each is online (its retained
status topic) and, per device, the retained DeviceState (last_fence,
held writes, last_op_id, state), with each gateway's total of held writes.
A gateway that stopped shows offline and no longer registered.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if etcd == "" {
				return usagef("--etcd is required")
			}
			var co *controller.ConnOptions
			if mf.broker != "" || os.Getenv("EDGECTL_BROKER") != "" {
				o, err := mf.options("+", prefix)
				if err != nil {
					return err
				}
				co = &o
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second+wait)
			defer cancel()
			gws, err := fleet(ctx, strings.Split(etcd, ","), dirPrefix, co, prefix, wait)
			if err != nil {
				return err
			}
			return printFleet(cmd.OutOrStdout(), gws, asJSON, co != nil)
		},
	}
	mf.add(c.Flags())
	c.Flags().StringVar(&etcd, "etcd", "", "etcd endpoints, comma-separated (required)")
	c.Flags().StringVar(&dirPrefix, "directory-prefix", controller.DefaultDirectoryPrefix, "the agents' coordination.etcd.prefix")
	c.Flags().StringVar(&prefix, "prefix", wire.DefaultPrefix, "MQTT topic prefix")
	c.Flags().BoolVar(&asJSON, "json", false, "print the fleet as one JSON array")
	c.Flags().DurationVar(&wait, "wait", 3*time.Second, "with --broker: how long to wait for the retained topics at most")
	return c
}

func fleet(ctx context.Context, eps []string, dirPrefix string, co *controller.ConnOptions, prefix string, wait time.Duration) ([]*fleetGateway, error) {
	cli, err := dialEtcd(ctx, eps)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	byID := map[string]*fleetGateway{}
	gwOf := func(id string) *fleetGateway {
		g := byID[id]
		if g == nil {
			g = &fleetGateway{Gateway: id}
			byID[id] = g
		}
		return g
	}
	devOf := func(g *fleetGateway, dev string) *fleetDevice {
		for i := range g.Devices {
			if g.Devices[i].Device == dev {
				return &g.Devices[i]
			}
		}
		g.Devices = append(g.Devices, fleetDevice{Device: dev})
		return &g.Devices[len(g.Devices)-1]
	}
	// One transaction: the registrations, the stores and the directory
	// of one revision.
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet(dirPrefix+"/gateways/", clientv3.WithPrefix()),
		clientv3.OpGet(dirPrefix+"/stores/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(dirPrefix+"/devices/", clientv3.WithPrefix()),
		clientv3.OpGet(dirPrefix+"/standbys/", clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var reg struct {
			Gateway   string    `json:"gateway"`
			Host      string    `json:"host"`
			PID       int       `json:"pid"`
			Version   string    `json:"version"`
			StartedAt time.Time `json:"started_at"`
			Role      string    `json:"role"`
		}
		id := strings.TrimPrefix(string(kv.Key), dirPrefix+"/gateways/")
		if strings.Contains(id, "/") || json.Unmarshal(kv.Value, &reg) != nil {
			continue
		}
		if reg.Role == "" {
			reg.Role = "active" // an agent from before the registration named its role
		}
		g := gwOf(id)
		g.Registered, g.Host, g.PID, g.Version, g.StartedAt, g.Role = true, reg.Host, reg.PID, reg.Version, reg.StartedAt, reg.Role
	}
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		var sb fleetStandby
		id, _, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), dirPrefix+"/standbys/"), "/")
		if !ok || json.Unmarshal(kv.Value, &sb) != nil {
			continue
		}
		g := gwOf(id)
		g.Standbys = append(g.Standbys, sb)
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if id := strings.TrimPrefix(string(kv.Key), dirPrefix+"/stores/"); !strings.Contains(id, "/") {
			gwOf(id)
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		dev, ok := strings.CutSuffix(strings.TrimPrefix(string(kv.Key), dirPrefix+"/devices/"), "/gateway")
		if !ok || strings.Contains(dev, "/") || !wire.ValidDeviceID(string(kv.Value)) {
			continue
		}
		devOf(gwOf(string(kv.Value)), dev).Claimed = true
	}
	if co != nil {
		if err := retained(ctx, *co, prefix, wait, func(gw string, status *wire.GatewayStatus, ds *wire.DeviceState) {
			g := gwOf(gw)
			if status != nil {
				g.Status, g.Online = status.State, status.State == "online"
				if g.Version == "" {
					g.Version = status.Version
				}
				if g.Host == "" {
					g.Host = status.Host
				}
				if g.Role == "" && g.Online {
					g.Role = status.Role
				}
				return
			}
			d := devOf(g, ds.Device)
			d.LastFence, d.LastOpID, d.State, d.At, d.HeldWrites = ds.LastFence, ds.LastOpID, ds.State, ds.At, max(ds.HeldWrites, 0)
		}); err != nil {
			return nil, err
		}
	}
	var out []*fleetGateway
	for _, g := range byID {
		slices.SortFunc(g.Devices, func(a, b fleetDevice) int { return strings.Compare(a.Device, b.Device) })
		if g.Devices == nil {
			g.Devices = []fleetDevice{}
		}
		for _, d := range g.Devices {
			g.HeldWrites += d.HeldWrites
		}
		slices.SortFunc(g.Standbys, func(a, b fleetStandby) int {
			if c := strings.Compare(a.Host, b.Host); c != 0 {
				return c
			}
			return a.PID - b.PID
		})
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *fleetGateway) int { return strings.Compare(a.Gateway, b.Gateway) })
	return out, nil
}

// retained reads the retained {p}/+/status and {p}/+/devices/+/state
// messages. They come right after the SUBACK; to know they all came, it
// then publishes a marker to a topic of its own and stops when the marker
// comes back (the broker sends one client's messages in order), or after
// wait.
func retained(ctx context.Context, co controller.ConnOptions, prefix string, wait time.Duration, got func(gw string, s *wire.GatewayStatus, d *wire.DeviceState)) error {
	id := "edgectl-fleet-" + controller.NewOpID()[:8]
	marker := prefix + "/edgectl/" + id
	status, state := prefix+"/+/status", prefix+"/+/devices/+/state"
	var mu sync.Mutex
	done := make(chan struct{})
	var once sync.Once
	opts := paho.NewClientOptions()
	for _, b := range co.BrokerURLs() {
		opts.AddBroker(b)
	}
	opts.SetUsername(co.Username).SetPassword(co.Password).SetTLSConfig(co.TLS).
		SetClientID(id).SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			if m.Topic() == marker {
				once.Do(func() { close(done) })
				return
			}
			if !m.Retained() || len(m.Payload()) == 0 {
				return
			}
			b := m.Payload()
			parts := strings.Split(strings.TrimPrefix(m.Topic(), prefix+"/"), "/")
			// A signed DeviceState is read as watch reads it; with
			// --gateway-key, only a state that key signed for the topic's
			// gateway is taken. (The status topic is never signed.)
			if len(parts) == 4 {
				if jws.Looks(b) {
					tok, err := jws.Parse(b)
					if err != nil || co.ResultKey != nil && (tok.Header.Kid != parts[0] || tok.Verify(co.ResultKey) != nil) {
						return
					}
					b = tok.Payload
				} else if co.ResultKey != nil {
					return
				}
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case len(parts) == 2 && parts[1] == "status":
				var s wire.GatewayStatus
				if json.Unmarshal(b, &s) == nil {
					got(parts[0], &s, nil)
				}
			case len(parts) == 4 && parts[1] == "devices" && parts[3] == "state":
				var d wire.DeviceState
				if json.Unmarshal(b, &d) == nil && d.Device == parts[2] {
					got(parts[0], nil, &d)
				}
			}
		})
	cli := paho.NewClient(opts)
	tok := cli.Connect()
	if !tok.WaitTimeout(6*time.Second) || tok.Error() != nil {
		return fmt.Errorf("broker %s unreachable: %v", strings.Join(co.BrokerURLs(), ","), tok.Error())
	}
	defer cli.Disconnect(100)
	st := cli.SubscribeMultiple(map[string]byte{status: 1, state: 1, marker: 1}, nil)
	if !st.WaitTimeout(5*time.Second) || st.Error() != nil {
		return fmt.Errorf("subscribe %s, %s: %v", status, state, st.Error())
	}
	cli.Publish(marker, 1, false, []byte("end"))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	mu.Lock() // the handler's last call has returned
	defer mu.Unlock()
	return nil
}

func printFleet(out io.Writer, gws []*fleetGateway, asJSON, withBroker bool) error {
	if asJSON {
		if gws == nil {
			gws = []*fleetGateway{}
		}
		b, err := json.Marshal(gws)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	}
	// Held writes are known only from the retained DeviceStates.
	held := func(n int) string {
		if !withBroker {
			return "-"
		}
		return fmt.Sprint(n)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GATEWAY\tSTATUS\tROLE\tHOST\tSTANDBY\tVERSION\tSTARTED\tDEVICES\tHELD")
	for _, g := range gws {
		status := g.Status
		switch {
		case !withBroker && g.Registered:
			status = "registered"
		case !withBroker:
			status = "not registered"
		case status == "":
			status = "offline (no status)"
		}
		started := "-"
		if !g.StartedAt.IsZero() {
			started = g.StartedAt.UTC().Format(time.RFC3339)
		}
		// Of a pair, the hosts with their pids: two agents of one gateway
		// may run on one host.
		host := dash(g.Host)
		var standby []string
		for _, s := range g.Standbys {
			standby = append(standby, fmt.Sprintf("%s (pid %d)", s.Host, s.PID))
		}
		if len(standby) > 0 && g.Registered {
			host = fmt.Sprintf("%s (pid %d)", g.Host, g.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", g.Gateway, status, dash(g.Role), host,
			dash(strings.Join(standby, ", ")), dash(g.Version), started, len(g.Devices), held(g.HeldWrites))
	}
	tw.Flush()
	for _, g := range gws {
		if len(g.Devices) == 0 {
			continue
		}
		fmt.Fprintf(out, "\n%s:\n", g.Gateway)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  DEVICE\tCLAIMED\tLAST_FENCE\tHELD\tLAST_OP\tSTATE")
		for _, d := range g.Devices {
			fmt.Fprintf(tw, "  %s\t%v\t%d\t%s\t%s\t%s\n", d.Device, d.Claimed, d.LastFence, held(d.HeldWrites), dash(d.LastOpID), dash(string(d.State)))
		}
		tw.Flush()
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

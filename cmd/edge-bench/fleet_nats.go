package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/edge-agent/edge-agent/internal/mqtt"
	"github.com/edge-agent/edge-agent/internal/rig"
)

// The fleet run's NATS cluster: three nats-server nodes on loopback, each
// with JetStream (a store of its own), the cluster's routes and the MQTT
// interface, its streams replicated on all three (docs/protocol.md §9).
// The bench starts its own until the project's test kit (the nats
// branch's rig.StartNATS) is on main.

const fleetNATSNodes = 3

// natsConf is one node's configuration: JetStream under store, the
// cluster "fleet" routed to every port of routes (NATS ignores the route
// to itself), MQTT on mqttPort with stream_replicas 3 and a short
// ack_wait (a QoS 1 message not acknowledged in time is sent again).
func natsConf(name string, clientPort, routePort, mqttPort int, routes []int, store string) string {
	var rs []string
	for _, p := range routes {
		rs = append(rs, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	return fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
}
cluster {
  name: fleet
  listen: 127.0.0.1:%d
  routes: [%s]
}
mqtt {
  listen: 127.0.0.1:%d
  stream_replicas: %d
  ack_wait: "3s"
  max_ack_pending: 1024
}
`, name, clientPort, store, routePort, strings.Join(rs, ", "), mqttPort, fleetNATSNodes)
}

// startFleetNATS starts the cluster with its data under dir and returns
// once every node accepts an MQTT client's CONNECT and QoS 1 SUBSCRIBE (a
// fresh node refuses them until JetStream has a meta leader and the MQTT
// streams exist: polled, up to 3 minutes).
func startFleetNATS(dir string) (*fleetBroker, error) {
	bin, err := exec.LookPath("nats-server")
	if err != nil {
		if _, err2 := os.Stat("/usr/sbin/nats-server"); err2 != nil {
			return nil, fmt.Errorf("nats-server not installed (apt-get install nats-server): %w", err)
		}
		bin = "/usr/sbin/nats-server"
	}
	type node struct {
		name, conf, log     string
		client, route, mqtt int
	}
	var nodes []node
	var routes []int
	taken := map[int]bool{}
	for i := range fleetNATSNodes {
		n := node{name: fmt.Sprintf("n%d", i+1)}
		for _, p := range []*int{&n.client, &n.route, &n.mqtt} {
			for {
				if *p, err = rig.FreePort(); err != nil {
					return nil, err
				}
				if !taken[*p] {
					taken[*p] = true
					break
				}
			}
		}
		nd := filepath.Join(dir, "nats", n.name)
		if err := os.MkdirAll(nd, 0o700); err != nil {
			return nil, err
		}
		n.conf, n.log = filepath.Join(nd, "nats.conf"), filepath.Join(nd, "nats.log")
		routes = append(routes, n.route)
		nodes = append(nodes, n)
	}
	br := &fleetBroker{name: "nats"}
	var procs []*rig.Proc
	br.stop = func() {
		for _, p := range procs {
			p.Stop(syscall.SIGTERM, 10*time.Second)
		}
	}
	for _, n := range nodes {
		conf := natsConf(n.name, n.client, n.route, n.mqtt, routes, filepath.Join(filepath.Dir(n.conf), "store"))
		if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
			br.stop()
			return nil, err
		}
		logf, err := os.Create(n.log)
		if err != nil {
			br.stop()
			return nil, err
		}
		p, err := rig.Start(rig.Options{Out: logf}, bin, "-c", n.conf)
		logf.Close() // the child has its own
		if err != nil {
			br.stop()
			return nil, err
		}
		procs = append(procs, p)
		br.pids = append(br.pids, p.PID())
		br.urls = append(br.urls, fmt.Sprintf("tcp://127.0.0.1:%d", n.mqtt))
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			var last error
			ok := rig.WaitFor(3*time.Minute, func() bool {
				if !procs[i].Running() {
					return true
				}
				last = mqttAccepts(br.urls[i], "fleet-probe-"+nodes[i].name)
				if last != nil {
					time.Sleep(200 * time.Millisecond)
				}
				return last == nil
			})
			if !procs[i].Running() {
				last, ok = fmt.Errorf("exited (%s)", procs[i].Ended()), false
			}
			if !ok {
				b, _ := os.ReadFile(nodes[i].log)
				if len(b) > 2000 {
					b = b[len(b)-2000:]
				}
				errs[i] = fmt.Errorf("nats node %s does not accept MQTT clients on %s: %v\n%s", nodes[i].name, br.urls[i], last, b)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		br.stop()
		return nil, err
	}
	return br, nil
}

// mqttAccepts connects to url as clientID (clean session), subscribes to
// a topic of its own at QoS 1 and disconnects: nil when both were
// accepted.
func mqttAccepts(url, clientID string) error {
	o := paho.NewClientOptions().AddBroker(url).SetClientID(clientID).SetCleanSession(true).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetCustomOpenConnectionFn(mqtt.OpenConnection)
	c := paho.NewClient(o)
	if t := c.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		c.Disconnect(0)
		return fmt.Errorf("connect: %v", t.Error())
	}
	defer c.Disconnect(100)
	t := c.Subscribe("fleet/probe/"+clientID, 1, nil)
	if !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return fmt.Errorf("subscribe: %v", t.Error())
	}
	if st, ok := t.(*paho.SubscribeToken); ok && st.Result()["fleet/probe/"+clientID] == 0x80 {
		return errors.New("subscribe refused")
	}
	return nil
}

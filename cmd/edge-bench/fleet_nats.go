package main

import (
	"github.com/edge-agent/edge-agent/internal/rig"
)

// startFleetNATS starts the fleet run's NATS cluster with the project's
// kit (rig.StartNATS): three nats-server nodes on loopback, each with
// JetStream (a store of its own), the cluster's routes and the MQTT
// interface, its streams replicated on all three, ack_wait 3s
// (docs/protocol.md §9, docs/operations.md); it returns once every node
// accepts an MQTT CONNECT and a QoS 1 SUBSCRIBE. Its data is under dir.
func startFleetNATS(dir string) (*fleetBroker, error) {
	c, err := rig.StartNATS(rig.NATSOptions{Dir: dir, Nodes: 3})
	if err != nil {
		return nil, err
	}
	br := &fleetBroker{name: "nats", urls: c.URLs(), stop: c.Stop}
	for _, n := range c.Nodes {
		br.pids = append(br.pids, n.PID())
	}
	return br, nil
}

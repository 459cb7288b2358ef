package mqtttest

import (
	"os"
	"testing"

	"github.com/edge-agent/edge-agent/internal/rig"
)

// NATS is a NATS server cluster (rig.NATSCluster: JetStream, cluster
// routes and the MQTT listener on every node) started for one test.
type NATS struct {
	*rig.NATSCluster
	t testing.TB
}

// StartNATS starts a 3-node NATS cluster (rig.StartNATS with o; o.Dir
// defaults to t.TempDir()) and returns once every node accepts MQTT
// clients. It is stopped in t.Cleanup, and each node's log tail is logged
// if the test failed.
//
// Without a nats-server binary the test is skipped, except under CI (CI
// set in the environment), where it fails: CI must install it
// (apt-get install nats-server).
func StartNATS(t testing.TB, o rig.NATSOptions) *NATS {
	t.Helper()
	if _, err := rig.FindNATS(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("mqtttest: %v", err)
		}
		t.Skipf("mqtttest: %v", err)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	c, err := rig.StartNATS(o)
	if err != nil {
		t.Fatalf("mqtttest: %v", err)
	}
	n := &NATS{NATSCluster: c, t: t}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			for i, nd := range c.Nodes {
				t.Logf("nats %s log:\n%s", nd.Name, c.Log(i, 3000))
			}
		}
	})
	return n
}

// URL is node i's MQTT URL.
func (n *NATS) URL(i int) string { return n.Nodes[i].URL() }

// Restart restarts node i (same ports and store) and fails the test if it
// does not accept MQTT clients again.
func (n *NATS) Restart(i int) {
	n.t.Helper()
	if err := n.NATSCluster.Restart(i); err != nil {
		n.t.Fatalf("mqtttest: %v", err)
	}
}

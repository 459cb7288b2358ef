// Package controller is the controller side of edge-agent: it takes named
// locks in etcd (a lease plus concurrency.Mutex), turns each into a
// fencing token (the lock key's create revision), watches ownership
// (the Holder state machine: IDLE, ACQUIRING, ACTIVE, RELEASING, LOST,
// RELEASED), and sends fenced commands to an agent's devices over MQTT,
// awaiting their Results (Sender), or to devices on any gateway of a
// fleet through the device directory in etcd (LookupGateway,
// FleetSender). docs/controller.md is the guide;
// examples/controller is a runnable holder loop.
//
// Lock names are etcd key prefixes (a holder's key is NAME/LEASE-ID), so
// no lock name may be a prefix of another followed by "/".
package controller

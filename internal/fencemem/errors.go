package fencemem

import "errors"

var (
	// ErrClone is returned by Start (and reported by Failed) when another
	// live agent holds this gateway's registration: a copied image, or two
	// configurations with one gateway_id. The process exits 1.
	ErrClone = errors.New("fencemem: another live agent runs as this gateway")
	// ErrClaimed is returned by Start when a configured device is claimed
	// by another live gateway. The process exits 2 (the configurations
	// disagree about who fronts the device).
	ErrClaimed = errors.New("fencemem: a device is fronted by another live gateway")
	// ErrRaced is returned when this gateway's store record in etcd
	// changed between its read and its update (another agent checked in
	// as this gateway meanwhile); the check is done again.
	ErrRaced = errors.New("fencemem: the store record in etcd changed meanwhile")
)

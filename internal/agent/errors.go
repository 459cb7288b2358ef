package agent

import "errors"

var (
	// ErrUnknownDevice is returned by admin calls for a device that is not configured.
	ErrUnknownDevice = errors.New("agent: unknown device")
	// ErrNoSuchOp is returned by admin calls for an op_id with no record.
	ErrNoSuchOp = errors.New("agent: no such operation")
	// ErrQueryable is returned by Resolve for a device that can be asked
	// itself (queryable: true): the agent resolves its writes.
	ErrQueryable = errors.New("agent: device is queryable; the agent resolves its writes itself")
	// ErrNotUnknown is returned by Resolve for an operation whose outcome is
	// not unknown.
	ErrNotUnknown = errors.New("agent: operation is not unknown")
	// ErrUnpublishable is what a Publisher's PublishAsync error wraps when
	// the message can never be published (its topic is not a valid MQTT
	// topic): the publisher drops it, logged and counted, instead of
	// retrying it for ever ahead of everything behind it.
	ErrUnpublishable = errors.New("agent: the message can never be published")
	// ErrBadRequest is returned by admin calls for a malformed query (a
	// limit out of range, a cursor that no page gave out).
	ErrBadRequest = errors.New("agent: bad request")
	// ErrTooMany is returned by Subscribe when MaxEventClients
	// streams are open.
	ErrTooMany = errors.New("agent: too many event streams")
)

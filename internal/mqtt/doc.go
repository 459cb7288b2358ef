// Package mqtt is edge-agent's broker session (docs/protocol.md §1, docs/design.md
// "Operational notes") and its optional embedded broker.
//
// # Client
//
// Client wraps paho (github.com/eclipse/paho.mqtt.golang v1.5.1, MQTT
// 3.1.1) with the settings the agent's guarantees depend on:
//
//   - a stable client ID and a persistent session (clean session false),
//     so commands published while the agent is away are queued by the
//     broker;
//   - the handler is registered before connecting (a persistent session's
//     queued messages arrive right after CONNACK) and is called in arrival
//     order on paho's router goroutine (OrderMatters);
//   - manual acknowledgements (paho's AutoAckDisabled): the caller acks
//     each delivery once it is durable, and Client sends the PUBACKs in
//     arrival order whatever the order of the Ack calls (Message.Ack);
//   - the subscriptions are sent again on every (re)connect, from a
//     goroutine of Client's own (paho's ResumeSubs is off: it would only
//     resend a SUBSCRIBE that was in flight);
//   - automatic reconnection with backoff capped at MaxReconnectInterval;
//     with Brokers (the nodes of one cluster), every attempt tries the
//     nodes in order and keeps the first that accepts (paho's
//     attemptConnection), so the client moves to the next node when its
//     node is lost; the ordered store, the acker and the subscriptions
//     belong to the Client, not to a connection, so they carry over;
//   - a retained status topic: OnlinePayload on every connect,
//     OfflinePayload on a clean Close, WillPayload as the last will, and a
//     repair when a late will overwrites "online" (Options.OnlinePayload);
//   - QoS 1 publishing with a bounded window of unacknowledged publishes
//     (Publish waits for the PUBACK, PublishAsync pipelines), resent in
//     order after a reconnect (paho's ordered memory store).
//
// What paho v1.5.1 does that callers should know (read from its source):
// a message redelivered by the broker after a reconnect comes with
// Duplicate set (the broker's DUP flag; paho passes it on); an Ack for a
// message of a connection that has since been lost is dropped by paho
// (the broker redelivers the message on the new connection); paho's
// in-memory store discards inbound messages on reconnect (the broker
// owns redelivery) and keeps our unacknowledged publishes, which it
// resends; before the first connection is up, paho refuses publishes.
//
// # Embedded
//
// Embedded runs mochi-mqtt v2.7.9 in-process, persisted with its bbolt
// hook, with limits that do not drop QoS 1 messages under a burst (see
// Embedded) and a store hook that works around mochi defects which lose
// or reorder a persistent session's messages (see sessionHook: packet IDs
// not stored, resend order random within a second, one packet-ID space
// for both directions, a publish acknowledged before it is routed so that
// a later one from another connection can overtake it; docs/mochi.md,
// which also describes a fifth defect that is not worked around).
//
// # Tests
//
// Package internal/testkit/mqtttest starts real brokers (mosquitto with
// the shipped configs/mosquitto.conf, or Embedded) for tests.
// mochi_defects_test.go reproduces each mochi defect against upstream
// mochi, and shows that sessionHook handles it (docs/mochi.md).
package mqtt

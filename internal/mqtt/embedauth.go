package mqtt

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// The embedded broker's access rules (docs/config.md, "The embedded
// broker"). Two listeners:
//
//   - the public one (EmbeddedOptions.Listen, TLS with
//     EmbeddedOptions.TLS), for controllers and tools: with a password
//     file, a client must present a user and password from it (anonymous
//     clients only with AllowAnonymous); without one, anyone connects (the
//     configuration allows that on loopback only, or with
//     embedded_allow_anonymous). An ACL file, when given, says who may
//     publish and subscribe where; the agent's own client ID is refused
//     here, so nobody can take over its persistent session.
//   - the agent's own, on 127.0.0.1 with a port picked at Start: only the
//     credentials generated at Start are accepted there, and they may do
//     everything. The agent needs nothing configured to reach its broker,
//     whatever TLS and passwords the public listener requires.

// agentListener is the ID of the agent's own listener.
const agentListener = "agent"

type authHook struct {
	mochi.HookBase
	o         EmbeddedOptions
	agentUser []byte
	agentPass []byte
}

func newAuthHook(o EmbeddedOptions) (*authHook, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	return &authHook{o: o, agentUser: []byte("edge-agent"), agentPass: []byte(hex.EncodeToString(b[:]))}, nil
}

func (h *authHook) ID() string { return "edge-agent-auth" }

func (h *authHook) Provides(b byte) bool {
	return b == mochi.OnConnectAuthenticate || b == mochi.OnACLCheck
}

// OnConnectAuthenticate decides a CONNECT by the rules above.
func (h *authHook) OnConnectAuthenticate(cl *mochi.Client, pk packets.Packet) bool {
	user, pass := pk.Connect.Username, pk.Connect.Password
	if cl.Net.Listener == agentListener {
		return subtle.ConstantTimeCompare(user, h.agentUser)&subtle.ConstantTimeCompare(pass, h.agentPass) == 1
	}
	if h.o.AgentClientID != "" && pk.Connect.ClientIdentifier == h.o.AgentClientID {
		h.Log.Warn("refused a client using the agent's client ID on the public listener", "remote", cl.Net.Remote)
		return false
	}
	ok := true
	switch {
	case h.o.Passwords == nil:
	case len(user) == 0:
		ok = h.o.AllowAnonymous
	default:
		ok = h.o.Passwords.Check(string(user), pass)
	}
	if !ok {
		h.Log.Warn("refused a client: bad or missing credentials", "username", string(user), "remote", cl.Net.Remote)
	}
	return ok
}

// OnACLCheck applies the ACL file (mochi calls it for each publish, each
// subscription filter and each message delivered).
func (h *authHook) OnACLCheck(cl *mochi.Client, topic string, write bool) bool {
	if cl.Net.Listener == agentListener || h.o.ACL == nil {
		return true
	}
	return h.o.ACL.Allowed(string(cl.Properties.Username), cl.ID, topic, write)
}

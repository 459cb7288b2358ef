package agent

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
	"github.com/edge-agent/edge-agent/internal/auth"
	"github.com/edge-agent/edge-agent/internal/clip"
	"github.com/edge-agent/edge-agent/internal/wirefast"
)

// Signed commands on arrival (docs/protocol.md §6). Whether a command is
// unauthorized is decided by auth.Verifier.Open, before anything is read
// from or written to the store: an unauthorized command claims no op_id,
// raises no fence, takes no queue slot (decide.go's Arrive), and its
// Result goes only to the device's result topic, at most
// UnauthorizedPerSecond per device; the rest are dropped and counted.

// UnauthorizedPerSecond is how many unauthorized Results one device's
// result topic gets per second at most (bursts of as many). Every topic
// level that is not a configured device shares one more such budget, so
// the limiter's memory is bounded by the configuration, not by what
// publishers invent.
const UnauthorizedPerSecond = 10

type authState struct {
	v       *auth.Verifier
	limits  map[string]*rate.Limiter // per configured device
	others  *rate.Limiter            // every other topic level, together
	dropped prometheus.Counter
}

func newAuthState(v *auth.Verifier, devices []string, reg prometheus.Registerer) *authState {
	s := &authState{v: v, limits: map[string]*rate.Limiter{},
		others: rate.NewLimiter(UnauthorizedPerSecond, UnauthorizedPerSecond),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edge_agent_unauthorized_dropped_total",
			Help: "Unauthorized commands not answered because their device's result topic had its 10 Results per second already (docs/protocol.md §6).",
		})}
	for _, d := range devices {
		s.limits[d] = rate.NewLimiter(UnauthorizedPerSecond, UnauthorizedPerSecond)
	}
	if reg != nil {
		reg.MustRegister(s.dropped)
	}
	return s
}

// Verifier is the agent's signature checker (its keys can be replaced on
// SIGHUP: auth.Verifier.SetKeys).
func (a *Agent) Verifier() *auth.Verifier { return a.auth.v }

// open reads a delivery's payload as a command: a signed one (a compact
// JWS) through the verifier, a plain one through wirefast.ParseCommand. unauth
// is set when the device requires signatures and the payload is not a
// valid signed command for it. On a gateway that does not require
// signatures, a JWS that cannot be accepted is invalid (it is no Command
// either), and a message that is not even a JWS is parsed as a Command
// (so garbage gets the parser's reason, as before signed commands).
func (a *Agent) open(dev string, msg []byte) (cmd wire.Command, unauth *auth.Error, pe *wire.ParseError) {
	v := a.auth.v
	if jws.Looks(msg) {
		var err error
		if cmd, _, err = v.Open(msg, dev, a.now()); err == nil {
			return cmd, nil, nil
		}
		if errors.As(err, &pe) {
			return wire.Command{}, nil, pe
		}
		errors.As(err, &unauth)
		if v.Required() {
			return wire.Command{}, unauth, nil
		}
		if _, perr := jws.Parse(msg); perr == nil {
			return wire.Command{}, nil, &wire.ParseError{Reason: "a signed command that cannot be accepted: " + unauth.Reason}
		}
		// Not a JWS at all: a malformed Command, answered as one.
	} else if v.Required() {
		return wire.Command{}, &auth.Error{Reason: fmt.Sprintf("gateway %s requires signed commands (security.require_signed): this one is not signed", a.cfg.GatewayID)}, nil
	}
	cmd, err := wirefast.ParseCommand(msg)
	if err != nil {
		errors.As(err, &pe)
	}
	return cmd, nil, pe
}

// unauthorized answers an unauthorized delivery on dev's result topic
// (never its reply_to), or drops the answer when dev's budget is spent
// (the delivery is then only acknowledged).
func (a *Agent) unauthorized(ar *arrival, dev string, msg []byte, e *auth.Error) {
	lim := a.auth.limits[dev]
	if lim == nil {
		lim = a.auth.others
	}
	if !lim.Allow() {
		a.auth.dropped.Inc()
		ar.kind = AdmitIgnore
		return
	}
	var lf int64
	if rt := a.devs[dev]; rt != nil {
		lf = rt.lastFence.Load()
	}
	opID, fence := echo(msg)
	a.log.Warn("unauthorized command refused", "device", clip.String(dev, 80), "op_id", opID, "fence", fence, "key", e.KeyID, "reason", e.Reason)
	// The op_id is read unverified: the Result names the refused bytes,
	// so it cannot stand for another command's outcome (a controller
	// takes it only for the payload it published itself).
	a.answerOnArrival(ar, "", wire.Result{V: wire.Version, OpID: opID, Device: dev, Fence: fence,
		Status: wire.StatusRejected, Code: wire.CodeUnauthorized, Reason: e.Reason, LastFence: lf, At: a.now().UTC(),
		PayloadSHA256: wire.PayloadDigest(msg)})
}

// echo reads what an unauthorized command's Result can echo (op_id and
// fence, when they can be read), so its sender can tell which command
// was refused. It is only called for the commands that are answered.
func echo(msg []byte) (string, int64) {
	if jws.Looks(msg) {
		// The middle segment, however malformed the rest (alg none has
		// no signature).
		parts := bytes.SplitN(bytes.TrimSpace(msg), []byte{'.'}, 3)
		if len(parts) < 2 {
			return "", 0
		}
		p, err := base64.RawURLEncoding.DecodeString(string(parts[1]))
		if err != nil {
			return "", 0
		}
		msg = p
	}
	cmd, err := wirefast.ParseCommand(msg)
	var pe *wire.ParseError
	if errors.As(err, &pe) {
		return pe.OpID, pe.Fence
	}
	return cmd.OpID, cmd.Fence
}

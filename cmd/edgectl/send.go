package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

type sendFlags struct {
	mqtt                    mqttFlags
	gateway, device, action string
	params                  []string
	fence                   int64
	lock, etcd              string
	directory               string
	opID                    string
	timeout                 time.Duration
	prefix                  string
	ttl                     time.Duration
	signKey, keyID          string
	asJSON                  bool
}

func sendCmd() *cobra.Command {
	var f sendFlags
	c := &cobra.Command{
		Use:   "send",
		Short: "Send one command and wait for its Result (exit 0 when applied)",
		Long: `Send one command to a device through the agent and wait for its final Result.

Without --gateway, --etcd URL[,URL...] finds the device's gateway in the
device directory the agents keep there ({prefix}/devices/{dev}/gateway).
The fence is either given (--fence N) or taken from an etcd lock
(--lock NAME --etcd URL[,URL...]): edgectl acquires the lock, uses the lock
key's create revision as the fence, sends, and releases the lock. With
--fence, --lock NAME alone (no --etcd) only puts the lock's name in the
command, for devices bound to a lock.
--param KEY=VALUE reads VALUE as JSON when it parses (rpm=1200, on=true),
else as a string. --timeout D bounds the whole send and is also the
command's expires_at (now + D): when edgectl gives up and says the outcome
is unknown, the agent will not start the command after that moment.
Exit status: 0 applied, 1 any other outcome, 2 usage.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSend(cmd.Context(), f, cmd.OutOrStdout()) },
	}
	fl := c.Flags()
	f.mqtt.add(fl)
	fl.StringVar(&f.gateway, "gateway", "", "gateway ID (required unless --etcd: then the device directory says)")
	fl.StringVar(&f.device, "device", "", "device ID (required)")
	fl.StringVar(&f.action, "action", "", "action (required)")
	fl.StringArrayVar(&f.params, "param", nil, "KEY=VALUE parameter, repeatable")
	fl.Int64Var(&f.fence, "fence", 0, "fencing token to send (or use --lock and --etcd)")
	fl.StringVar(&f.lock, "lock", "", "etcd lock to take first; its key's revision is the fence")
	fl.StringVar(&f.etcd, "etcd", "", "etcd endpoints, comma-separated (with --lock; without --gateway, the device's gateway is looked up there)")
	fl.StringVar(&f.directory, "directory-prefix", controller.DefaultDirectoryPrefix, "the agents' coordination.etcd.prefix (the device directory, without --gateway)")
	fl.StringVar(&f.opID, "op-id", "", "op_id (default: a fresh random one); reuse it to resend the same operation")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Second, "overall deadline (lock, send and Result); also the command's expires_at, so a send that gave up is never started later")
	fl.StringVar(&f.prefix, "prefix", wire.DefaultPrefix, "MQTT topic prefix")
	fl.DurationVar(&f.ttl, "lock-ttl", 10*time.Second, "lease TTL of the lock (with --lock)")
	fl.StringVar(&f.signKey, "sign-key", "", "sign the command with this Ed25519 private key (PKCS#8 PEM, edgectl keygen), with --key-id")
	fl.StringVar(&f.keyID, "key-id", "", "the key's id in the agent's security.keys (with --sign-key)")
	fl.BoolVar(&f.asJSON, "json", false, "print the Result as one line of JSON")
	return c
}

// parseParams turns KEY=VALUE pairs into a JSON object; VALUE is JSON when
// it parses, else a string.
func parseParams(kvs []string) (json.RawMessage, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]json.RawMessage{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--param %q: want KEY=VALUE", kv)
		}
		if _, dup := m[k]; dup {
			return nil, usagef("--param %q: key %q given twice", kv, k)
		}
		if json.Valid([]byte(v)) && strings.TrimSpace(v) != "" {
			m[k] = json.RawMessage(strings.TrimSpace(v))
		} else {
			b, _ := json.Marshal(v)
			m[k] = b
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, usagef("--param: %v", err)
	}
	if err := wire.CheckParamKeys(b); err != nil {
		return nil, usagef("--param: %v", err)
	}
	return b, nil
}

func (f sendFlags) validate() error {
	switch {
	case f.gateway == "" && f.etcd == "":
		return usagef("--gateway is required (or --etcd, to look the device's gateway up)")
	case f.device == "":
		return usagef("--device is required")
	case !wire.ValidDeviceID(f.device):
		return usagef("--device %q is not a valid device ID ([A-Za-z0-9_.-]{1,64})", f.device)
	case f.action == "":
		return usagef("--action is required")
	case !wire.ValidAction(f.action):
		return usagef("--action %q is not a valid action ([a-z][a-z0-9_]{0,63})", f.action)
	case f.opID != "" && !wire.ValidOpID(f.opID):
		return usagef("--op-id %q is not a valid op_id ([A-Za-z0-9._:-]{1,128})", f.opID)
	case f.timeout <= 0:
		return usagef("--timeout must be positive")
	case (f.signKey == "") != (f.keyID == ""):
		return usagef("--sign-key and --key-id go together")
	}
	byFence := f.fence != 0
	// Without --gateway, --etcd alone is the directory's: it takes a lock
	// only with --lock.
	byLock := f.etcd != "" && (f.gateway != "" || f.lock != "") || (!byFence && f.lock != "")
	switch {
	case byFence && byLock:
		return usagef("give either --fence or --lock with --etcd, not both (--fence N --lock NAME without --etcd only names the lock in the command)")
	case !byFence && !byLock:
		return usagef("give --fence N, or --lock NAME with --etcd URL")
	case byFence && f.fence < 1:
		return usagef("--fence must be from 1 to 2^63-1")
	case byLock && (f.lock == "" || f.etcd == ""):
		return usagef("--lock and --etcd go together")
	}
	return nil
}

func runSend(ctx context.Context, f sendFlags, stdout io.Writer) error {
	if err := f.validate(); err != nil {
		return err
	}
	params, err := parseParams(f.params)
	if err != nil {
		return err
	}
	co, err := f.mqtt.options(f.gateway, f.prefix)
	if err != nil {
		return err
	}
	if f.gateway == "" && f.directory == "" {
		return usagef("--directory-prefix must not be empty")
	}
	// What was sent, for the message when the outcome is unknown.
	var sent sendRecord
	so := &controller.SendOptions{OnPublish: sent.published, OnUnknown: func(r wire.Result) {
		// Interim: the agent resolves the write with the device and
		// publishes the final Result to the same reply topic.
		if f.asJSON {
			b, _ := json.Marshal(r)
			fmt.Fprintln(stdout, string(b))
			return
		}
		fmt.Fprintf(stdout, "interim: %s/%s: %s (waiting for the final Result)\n", r.Status, r.Code, r.Reason)
	}}
	if f.signKey != "" {
		b, err := os.ReadFile(f.signKey)
		if err != nil {
			return usagef("--sign-key: %v", err)
		}
		if so.SignKey, err = jws.ParsePrivateKey(b); err != nil {
			return usagef("--sign-key %s: %v", f.signKey, err)
		}
		if !jws.ValidKeyID(f.keyID) {
			return usagef("--key-id %q: want [A-Za-z0-9._:-]{1,64}", f.keyID)
		}
		so.KeyID = f.keyID
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	var cli *clientv3.Client
	if f.etcd != "" {
		if cli, err = dialEtcd(ctx, strings.Split(f.etcd, ",")); err != nil {
			return err
		}
		defer cli.Close()
	}
	if co.Gateway == "" {
		if co.Gateway, err = controller.LookupGateway(ctx, cli, f.directory, f.device); err != nil {
			return err
		}
	}
	conn, err := controller.Dial(ctx, co)
	if err != nil {
		return err
	}
	defer conn.Close()

	var owner controller.Owner
	var holder *controller.Holder
	if f.fence != 0 {
		owner = &controller.FixedFence{Fence: f.fence, Lock: f.lock, Holder: holderName()}
	} else {
		holder, err = controller.Acquire(ctx, cli, []string{f.lock}, &controller.LockOptions{
			TTL: f.ttl, AcquireTimeout: f.timeout, Name: holderName(),
		})
		if err != nil {
			return fmt.Errorf("lock %s: %w", f.lock, err)
		}
		defer func() {
			rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer rcancel()
			_ = holder.Release(rctx)
		}()
		owner = holder
	}
	// expires_at is the deadline itself: once edgectl gives up ("outcome
	// unknown"), the agent will not start the command any more. A signed
	// one stays within the agent's default security.max_ttl (15m).
	deadline, _ := ctx.Deadline()
	so.ExpiresIn = max(time.Until(deadline), time.Millisecond)
	if so.SignKey != nil {
		so.ExpiresIn = min(so.ExpiresIn, 10*time.Minute)
	}
	s := controller.NewSender(conn, owner, so)
	if f.opID == "" { // edgectl's own, so that it can say which to resend
		f.opID = controller.NewOpID()
	}
	opts := []controller.CallOption{controller.WithOpID(f.opID)}
	sctx := ctx
	if holder != nil {
		// Stop waiting as soon as the lock is lost.
		var scancel context.CancelFunc
		sctx, scancel = mergeCancel(ctx, holder.Context())
		defer scancel()
	}
	r, err := s.Send(sctx, f.device, f.action, params, opts...)
	// Only a final Result is printed as the outcome: a busy one (or an
	// unknown one, printed as interim) left when Send gave up is none.
	if r.OpID != "" && r.Final() && r.Code != wire.CodeBusy && r.Code != wire.CodeFenceUnconfirmed {
		var b []byte
		if f.asJSON {
			b, _ = json.Marshal(r)
		} else {
			b, _ = json.MarshalIndent(r, "", "  ")
		}
		fmt.Fprintln(stdout, string(b))
	}
	if err != nil {
		var re *controller.ResultError
		switch {
		case errors.As(err, &re):
			return &outcomeError{err}
		case errors.Is(err, controller.ErrOutcomeUnknown):
			return &outcomeError{sent.unknown(f, r)}
		}
		return err
	}
	return nil
}

// sendRecord is what edgectl learnt of its publishes (SendOptions.OnPublish).
type sendRecord struct {
	expiresAt time.Time
	tries     int  // publishes
	acked     bool // the broker acknowledged one (PUBACK)
}

func (s *sendRecord) published(cmd wire.Command, err error) {
	s.tries++
	s.acked = s.acked || err == nil
	if cmd.ExpiresAt != nil {
		s.expiresAt = *cmd.ExpiresAt
	}
}

// unknown says, in the operator's words, that the outcome is unknown,
// why, what that means for the command and how to learn it. last is the
// last Result received (none: zero).
func (s *sendRecord) unknown(f sendFlags, last wire.Result) error {
	var why string
	switch {
	case s.tries == 0:
		why = "the command was not published before the deadline"
	case !s.acked:
		why = "the broker had not acknowledged the command when the deadline came (it may have taken it, and the agent with it)"
	case last.Code == wire.CodeBusy:
		why = "the device's queue was full (busy) until the deadline"
	case last.Code == wire.CodeFenceUnconfirmed:
		why = "the gateway could not yet confirm its fences (fence_unconfirmed) until the deadline"
	case last.Status == wire.StatusUnknown:
		why = fmt.Sprintf("the agent took it, and its last word was %s/%s: %s", last.Status, last.Code, last.Reason)
	default:
		why = "the broker took the command, and no final Result came before the deadline (it may be queued behind a held write)"
	}
	never := ""
	if !s.expiresAt.IsZero() {
		never = fmt.Sprintf("; it is never started after its expires_at %s", s.expiresAt.Format(time.RFC3339))
	}
	return fmt.Errorf("device %s op %s: outcome unknown after --timeout %s: %s%s. To learn it, send the same command again with --op-id %s, or see edgectl history --device %s",
		f.device, f.opID, f.timeout, why, never, f.opID, f.device)
}

// mergeCancel returns a context that ends when either a or b does.
func mergeCancel(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	return ctx, func() { stop(); cancel() }
}

// dialEtcd returns a client once one endpoint answers, or an error naming
// the endpoints.
func dialEtcd(ctx context.Context, eps []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 3 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(eps, ","), err)
	}
	var errs []error
	for _, ep := range eps {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := cli.Status(sctx, ep)
		cancel()
		if err == nil {
			return cli, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	cli.Close()
	return nil, fmt.Errorf("etcd unreachable: %w", errors.Join(errs...))
}

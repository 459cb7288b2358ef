package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/controller"
	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

func watchCmd() *cobra.Command {
	var mf mqttFlags
	var gateway, prefix string
	var duration time.Duration
	c := &cobra.Command{
		Use:   "watch",
		Short: "Print Results and device states as they arrive",
		Long: `Print every Result (on device result topics and controllers' reply
topics), every DeviceState and the gateway status as they arrive, one
line each: time, kind, topic, payload. Runs until interrupted (or --for).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if gateway == "" {
				return usagef("--gateway is required")
			}
			co, err := mf.options(gateway, prefix)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration)
				defer cancel()
			}
			return watch(ctx, co, cmd.OutOrStdout())
		},
	}
	mf.add(c.Flags())
	c.Flags().StringVar(&gateway, "gateway", "", "gateway ID (required)")
	c.Flags().StringVar(&prefix, "prefix", wire.DefaultPrefix, "MQTT topic prefix")
	c.Flags().DurationVar(&duration, "for", 0, "stop after this long (default: until interrupted)")
	return c
}

func watch(ctx context.Context, co controller.ConnOptions, out io.Writer) error {
	gw, prefix := co.Gateway, co.Prefix
	filters := map[string]byte{
		wire.ResultFilter(prefix, gw):          1,
		wire.StateFilter(prefix, gw):           1,
		controller.ReplyTopic(prefix, gw, "+"): 1,
		wire.StatusTopic(prefix, gw):           1,
	}
	var mu sync.Mutex
	lines := make(chan string, 1024)
	opts := paho.NewClientOptions()
	for _, b := range co.BrokerURLs() {
		opts.AddBroker(b)
	}
	opts.SetUsername(co.Username).SetPassword(co.Password).SetTLSConfig(co.TLS).
		SetClientID("edgectl-watch-" + controller.NewOpID()[:8]).
		SetCleanSession(true).SetAutoReconnect(true).SetConnectRetry(false).
		SetConnectTimeout(5 * time.Second).
		SetDefaultPublishHandler(func(_ paho.Client, m paho.Message) {
			kind := "result"
			switch {
			case strings.HasSuffix(m.Topic(), "/state"):
				kind = "state"
			case m.Topic() == wire.StatusTopic(prefix, gw):
				kind = "status"
			}
			l := fmt.Sprintf("%s %-6s %s %s", time.Now().UTC().Format(time.RFC3339Nano), kind, m.Topic(), shown(m.Payload(), co))
			// Never block in a handler: drop a line if the printer lags.
			select {
			case lines <- l:
			default:
			}
		}).
		SetOnConnectHandler(func(c paho.Client) {
			c.SubscribeMultiple(filters, nil)
		})
	cli := paho.NewClient(opts)
	tok := cli.Connect()
	if !tok.WaitTimeout(6*time.Second) || tok.Error() != nil {
		return fmt.Errorf("broker %s unreachable: %v", strings.Join(co.BrokerURLs(), ","), tok.Error())
	}
	defer cli.Disconnect(250)
	for {
		select {
		case <-ctx.Done():
			return nil
		case l := <-lines:
			mu.Lock()
			fmt.Fprintln(out, l)
			mu.Unlock()
		}
	}
}

// shown is a payload as watch prints it: JSON compacted; a JWS (a signed
// Result or DeviceState) as its payload, marked "(signed kid=..., verified|
// unverified|BAD SIGNATURE)".
func shown(b []byte, co controller.ConnOptions) string {
	if !jws.Looks(b) {
		return compact(b)
	}
	tok, err := jws.Parse(b)
	if err != nil {
		return fmt.Sprintf("%q (not a valid JWS: %v)", b, err)
	}
	mark := "unverified"
	if co.ResultKey != nil {
		mark = "verified"
		if tok.Header.Kid != co.Gateway || tok.Verify(co.ResultKey) != nil {
			mark = "BAD SIGNATURE"
		}
	}
	return fmt.Sprintf("%s (signed kid=%s, %s)", compact(tok.Payload), tok.Header.Kid, mark)
}

func compact(b []byte) string {
	var v json.RawMessage
	if json.Unmarshal(b, &v) == nil {
		if c, err := json.Marshal(v); err == nil {
			return string(c)
		}
	}
	return fmt.Sprintf("%q", b)
}

func statusCmd() *cobra.Command {
	var af adminFlags
	c := &cobra.Command{
		Use:   "status",
		Short: "Show a table of the agent's devices (GET /v1/devices)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := af.resolve(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return status(ctx, af, cmd.OutOrStdout())
		},
	}
	af.add(c.Flags())
	return c
}

func status(ctx context.Context, af adminFlags, out io.Writer) error {
	admin := af.admin
	url := admin + "/v1/devices"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usagef("--admin %q: %v", admin, err)
	}
	if af.token != "" {
		req.Header.Set("Authorization", "Bearer "+af.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s unreachable: %w", admin, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b)))
	}
	var devs []wire.DeviceInfo
	if err := json.NewDecoder(resp.Body).Decode(&devs); err != nil {
		return fmt.Errorf("GET %s: decode: %w", url, err)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tLAST_FENCE\tLAST_OP_ID\tQUEUE\tPENDING")
	for _, d := range devs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\n", d.Device, d.LastFence, d.LastOpID, d.QueueDepth, d.Pending)
	}
	return tw.Flush()
}

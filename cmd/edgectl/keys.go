package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/controller/wire"
	"github.com/edge-agent/edge-agent/controller/wire/jws"
)

func keygenCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "keygen",
		Short: "Write a new Ed25519 key pair for signed commands: NAME.key (PKCS#8 PEM, 0600) and NAME.pub (PKIX PEM)",
		Long: `Write a controller's key pair for signed commands (docs/protocol.md §6):
NAME.key, the private key (PKCS#8 PEM, mode 0600), for edgectl send
--sign-key or a controller; NAME.pub, the public key (PKIX PEM), for the
agent's security.keys[].public_key_file. Existing files are never
overwritten.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out NAME is required")
			}
			return keygen(out, cmd.OutOrStdout())
		},
	}
	c.Flags().StringVar(&out, "out", "", "path and name of the pair, without extension (required)")
	return c
}

func keygen(name string, stdout io.Writer) error {
	privPEM, pubPEM, err := jws.GenerateKey()
	if err != nil {
		return err
	}
	// O_EXCL: a key is never overwritten (a lost private key cannot be
	// recovered, a replaced one silently locks a controller out).
	write := func(path string, b []byte, mode os.FileMode) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists; not overwritten", path)
		}
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	if err := write(name+".key", privPEM, 0o600); err != nil {
		return err
	}
	if err := write(name+".pub", pubPEM, 0o644); err != nil {
		os.Remove(name + ".key")
		return err
	}
	fmt.Fprintf(stdout, "wrote %s.key (private, keep it with the controller) and %s.pub (for the agent's security.keys)\n", name, name)
	return nil
}

func resolveCmd() *cobra.Command {
	var af adminFlags
	var dev, op string
	var applied bool
	c := &cobra.Command{
		Use:   "resolve",
		Short: "Resolve an unknown write on a device that cannot be asked (POST .../resolve)",
		Long: `An operator's answer for a write held unknown on a device configured
queryable: false (docs/operations.md, "Unknown outcomes"): --applied=true
records it applied; --applied=false ends it failed/not_applied, never
resent. Prints the final Result. Exit 0 when the agent took the answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := af.resolve(); err != nil {
				return err
			}
			switch {
			case !wire.ValidDeviceID(dev):
				return usagef("--device %q is not a valid device ID", dev)
			case !wire.ValidOpID(op):
				return usagef("--op-id %q is not a valid op_id", op)
			case !cmd.Flags().Changed("applied"):
				return usagef("--applied=true or --applied=false is required")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return resolve(ctx, af, dev, op, applied, cmd.OutOrStdout())
		},
	}
	af.add(c.Flags())
	c.Flags().StringVar(&dev, "device", "", "device ID (required)")
	c.Flags().StringVar(&op, "op-id", "", "op_id of the unknown write (required)")
	c.Flags().BoolVar(&applied, "applied", false, "whether the write happened (required: --applied=true or --applied=false)")
	return c
}

func resolve(ctx context.Context, af adminFlags, dev, op string, applied bool, out io.Writer) error {
	u := af.admin + "/v1/devices/" + url.PathEscape(dev) + "/ops/" + url.PathEscape(op) + "/resolve"
	body, _ := json.Marshal(map[string]bool{"applied": applied})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(string(body)))
	if err != nil {
		return usagef("--admin %q: %v", af.admin, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if af.token != "" {
		req.Header.Set("Authorization", "Bearer "+af.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s unreachable: %w", af.admin, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	var r wire.Result
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("POST %s: decode: %w", u, err)
	}
	pretty, _ := json.MarshalIndent(r, "", "  ")
	fmt.Fprintln(out, string(pretty))
	return nil
}

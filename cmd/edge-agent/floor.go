package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/edge-agent/edge-agent/internal/store"
)

// floorCmd is `edge-agent fence floor` (docs/protocol.md §7): offline, it
// raises (never lowers) last_fence to N or above etcd's current revision,
// with an audit entry, for a store whose memory an operator knows to be
// incomplete.
func floorCmd() *cobra.Command {
	var dataDir, dev, reason, etcd string
	var all, fromEtcd bool
	var to int64
	c := &cobra.Command{
		Use:   "floor",
		Short: "Raise last_fence to N or to etcd's revision, with an audit entry (the agent must be stopped)",
		Long: `Raise a device's last_fence (--device DEV, or every device the store holds:
--all) to N (--to N) or to the etcd cluster's current revision + 1
(--from-etcd, with --etcd URLS), never lowering it, and record the act as
an audit entry "fence-floor:..." in the device's history.

For a store whose memory an operator knows to be incomplete (restored,
copied, from another gateway), with or without coordination: every
controller generation older than the floor is then stale_fence, and the
current holder takes a new lock and sends a barrier.

Offline only: while an agent holds the store this exits 1 within 2 s.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case dataDir == "":
				return &exitError{2, errors.New("--data-dir is required")}
			case (dev == "") == !all:
				return &exitError{2, errors.New("give one of --device DEV or --all")}
			case cmd.Flags().Changed("to") == fromEtcd:
				return &exitError{2, errors.New("give one of --to N or --from-etcd")}
			case fromEtcd && etcd == "":
				return &exitError{2, errors.New("--from-etcd needs --etcd URL[,URL...]")}
			case !fromEtcd && to < 1:
				return &exitError{2, errors.New("--to N must be 1 or more")}
			case reason == "":
				return &exitError{2, errors.New("--reason is required: say why, for the audit entry")}
			}
			if fromEtcd {
				rev, err := etcdRevision(cmd.Context(), strings.Split(etcd, ","))
				if err != nil {
					return fmt.Errorf("fence floor: %w", err)
				}
				// Above every fence issued so far: equal fences pass, and
				// the current holder's lock key may be etcd's last write
				// (keep-alives do not move the revision).
				to = rev + 1
			}
			return fenceFloor(cmd, filepath.Join(dataDir, "agent.db"), dev, to, reason)
		},
	}
	c.Flags().StringVar(&dataDir, "data-dir", "", "the agent's data_dir")
	c.Flags().StringVar(&dev, "device", "", "the device")
	c.Flags().BoolVar(&all, "all", false, "every device the store holds")
	c.Flags().Int64Var(&to, "to", 0, "the floor")
	c.Flags().BoolVar(&fromEtcd, "from-etcd", false, "the floor is etcd's current revision + 1 (read linearizably): above every fence issued so far")
	c.Flags().StringVar(&etcd, "etcd", "", "etcd endpoints for --from-etcd, comma-separated")
	c.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit entry)")
	return c
}

// etcdRevision reads the cluster's current revision linearizably.
func etcdRevision(ctx context.Context, eps []string) (int64, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "edge-agent-fence-floor")
	if err != nil {
		return 0, fmt.Errorf("etcd %s: %w", strings.Join(eps, ","), err)
	}
	return resp.Header.Revision, nil
}

func fenceFloor(cmd *cobra.Command, path, dev string, to int64, reason string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("fence floor: %w", err)
	}
	st, err := store.Open(path, &store.Options{OpenTimeout: 1500 * time.Millisecond})
	if err != nil {
		return fmt.Errorf("fence floor %s: %w", path, err)
	}
	st.Start()
	defer st.Close()
	devs := []string{dev}
	if dev == "" {
		if err := st.View(func(tx *store.Tx) error {
			devs, err = tx.StoredDevices()
			return err
		}); err != nil {
			return fmt.Errorf("fence floor: %w", err)
		}
	}
	type done struct {
		dev      string
		from, to int64
	}
	var out []done
	by := operator()
	if err := st.Update(context.Background(), func(tx *store.Tx) error {
		out = out[:0]
		for _, d := range devs {
			before, _, err := tx.Device(d)
			if err != nil {
				return err
			}
			after, _, err := tx.TakeFloor(d, to, by, reason, time.Now())
			if err != nil {
				return err
			}
			out = append(out, done{d, before.LastFence, after.LastFence})
		}
		return nil
	}); err != nil {
		return fmt.Errorf("fence floor: %w", err)
	}
	if err := st.Close(); err != nil {
		return fmt.Errorf("fence floor: %w", err)
	}
	for _, d := range out {
		fmt.Fprintf(cmd.OutOrStdout(), "%s: fence floor %d: last_fence %d -> %d\n", d.dev, to, d.from, d.to)
	}
	fmt.Fprintln(cmd.OutOrStdout(), "Next: start the agent; each holder takes a new lock and sends a barrier before any command.")
	return nil
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/config"
	"github.com/edge-agent/edge-agent/internal/store"
)

type inspectDevice struct {
	Device    string          `json:"device"`
	LastFence int64           `json:"last_fence"`
	LastOpID  string          `json:"last_op_id"`
	State     json.RawMessage `json:"state,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
	Ops       []store.Op      `json:"recent_ops"`
	Queued    int             `json:"queued"`
}

func inspectCmd() *cobra.Command {
	var dataDir, dev, cfgPath string
	var asJSON bool
	var limit int
	c := &cobra.Command{
		Use:   "inspect",
		Short: "Read the store offline: devices, last_fence, recent operations",
		Args:  usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case dataDir != "" && cfgPath != "":
				return &exitError{2, errors.New("give --data-dir or --config, not both")}
			case cfgPath != "":
				cfg, err := config.Load(cfgPath)
				if err != nil {
					return configErr(err)
				}
				dataDir = cfg.DataDir
			case dataDir == "":
				return &exitError{2, errors.New("--data-dir (or --config, to use its data_dir) is required")}
			}
			path := filepath.Join(dataDir, "agent.db")
			if _, err := os.Stat(path); err != nil {
				return fmt.Errorf("inspect: %w", err)
			}
			st, err := store.Open(path, &store.Options{ReadOnly: true, OpenTimeout: 1500 * time.Millisecond})
			if err != nil {
				return fmt.Errorf("inspect %s: %w", path, err)
			}
			defer st.Close()
			devs := map[string]*inspectDevice{}
			get := func(id string) *inspectDevice {
				if devs[id] == nil {
					devs[id] = &inspectDevice{Device: id}
				}
				return devs[id]
			}
			err = st.View(func(tx *store.Tx) error {
				if err := tx.Devices(func(id string, d store.Device) error {
					if dev != "" && id != dev {
						return nil
					}
					x := get(id)
					x.LastFence, x.LastOpID, x.State, x.UpdatedAt = d.LastFence, d.LastOpID, d.State, d.UpdatedAt
					return nil
				}); err != nil {
					return err
				}
				return tx.Ops(dev, func(o store.Op) error {
					x := get(o.Device)
					x.Ops = append(x.Ops, o)
					if o.Status == store.OpQueued {
						x.Queued++
					}
					return nil
				})
			})
			if err != nil {
				return err
			}
			if dev != "" && devs[dev] == nil {
				return fmt.Errorf("inspect: device %q has no records in %s", dev, path)
			}
			ids := make([]string, 0, len(devs))
			for id, x := range devs {
				ids = append(ids, id)
				sort.Slice(x.Ops, func(i, j int) bool { return x.Ops[i].ReceivedAt.After(x.Ops[j].ReceivedAt) })
				if len(x.Ops) > limit {
					x.Ops = x.Ops[:limit]
				}
			}
			sort.Strings(ids)
			out := cmd.OutOrStdout()
			if asJSON {
				list := make([]*inspectDevice, 0, len(ids))
				for _, id := range ids {
					list = append(list, devs[id])
				}
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			for _, id := range ids {
				x := devs[id]
				fmt.Fprintf(tw, "device %s\tlast_fence %d\tlast_op %s\tqueued %d\tstate %s\n", id, x.LastFence, x.LastOpID, x.Queued, string(x.State))
				for _, o := range x.Ops {
					code := string(o.Code)
					if o.Status != store.OpFinal {
						code = string(o.Status)
					}
					if o.Audit { // an operator's act (fence reset), not a command
						fmt.Fprintf(tw, "  %s\tfence %d\t%s\tAUDIT: %s\t%s\n", o.OpID, o.Fence, o.Action, o.Reason, o.ReceivedAt.Format(time.RFC3339))
						continue
					}
					fmt.Fprintf(tw, "  %s\tfence %d\t%s\t%s\t%s\n", o.OpID, o.Fence, o.Action, code, o.ReceivedAt.Format(time.RFC3339))
				}
			}
			return tw.Flush()
		},
	}
	c.Flags().StringVar(&dataDir, "data-dir", "", "the agent's data_dir")
	c.Flags().StringVar(&cfgPath, "config", "", "the agent's configuration file: inspect its data_dir")
	c.Flags().StringVar(&dev, "device", "", "only this device")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().IntVar(&limit, "recent", 20, "how many recent operations per device")
	return c
}

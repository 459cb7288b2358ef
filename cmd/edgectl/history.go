package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// do sends one request to the admin API and decodes a 200 answer into v.
func (a *adminFlags) do(ctx context.Context, method, path string, body, v any) error {
	if err := a.resolve(); err != nil {
		return err
	}
	u := a.admin + path
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return usagef("--admin %q: %v", a.admin, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin API %s unreachable: %w", a.admin, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, e.Error)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s %s: decode: %w", method, u, err)
	}
	return nil
}

// historyEntry is what edgectl reads of GET /v1/devices/{dev}/ops.
type historyEntry struct {
	OpID       string    `json:"op_id"`
	Fence      int64     `json:"fence"`
	Status     string    `json:"status"`
	Code       string    `json:"code"`
	Action     string    `json:"action"`
	Holder     string    `json:"holder"`
	Record     string    `json:"record"`
	ReceivedAt time.Time `json:"received_at"`
}

func historyCmd() *cobra.Command {
	var a adminFlags
	var device, before string
	var limit int
	var asJSON bool
	c := &cobra.Command{
		Use:   "history",
		Short: "Show a device's recent operations, newest first (GET /v1/devices/{dev}/ops)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if device == "" {
				return usagef("--device is required")
			}
			if limit < 1 || limit > 1000 {
				return usagef("--limit %d: want 1 to 1000", limit)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			q := url.Values{"limit": {strconv.Itoa(limit)}}
			if before != "" {
				q.Set("before", before)
			}
			var page struct {
				Ops  []json.RawMessage `json:"ops"`
				Next string            `json:"next"`
			}
			if err := a.do(ctx, http.MethodGet, "/v1/devices/"+url.PathEscape(device)+"/ops?"+q.Encode(), nil, &page); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				for _, o := range page.Ops {
					fmt.Fprintln(out, string(o))
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "RECEIVED\tOP_ID\tFENCE\tACTION\tOUTCOME\tHOLDER")
			for _, raw := range page.Ops {
				var e historyEntry
				if err := json.Unmarshal(raw, &e); err != nil {
					return fmt.Errorf("history entry: %w", err)
				}
				outcome := e.Status + "/" + e.Code
				if e.Code == "" {
					outcome = e.Record // queued or pending: no outcome yet
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", e.ReceivedAt.Local().Format(time.DateTime), e.OpID, e.Fence, e.Action, outcome, e.Holder)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if page.Next != "" {
				fmt.Fprintf(out, "(older: --before %s)\n", page.Next)
			}
			return nil
		},
	}
	a.add(c.Flags())
	c.Flags().StringVar(&device, "device", "", "device ID (required)")
	c.Flags().IntVar(&limit, "limit", 50, "how many operations (1 to 1000)")
	c.Flags().StringVar(&before, "before", "", "cursor from a previous page: older operations")
	c.Flags().BoolVar(&asJSON, "json", false, "print each entry as one line of JSON")
	return c
}

// Package manpage gives edge-agent and edgectl a hidden `man DIR`
// command: the section 1 pages of the program and of each of its
// commands, generated from their cobra definitions, so the pages say what
// --help says. `make deb` runs it and packages the pages. The pages' date
// is SOURCE_DATE_EPOCH's when set (the Makefile sets HEAD's commit time).
package manpage

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// Command is `man DIR` for root, hidden from help and from the pages.
// version goes into each page's footer.
func Command(root *cobra.Command, version string) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "Write the man pages (section 1) of every command into DIR",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root.DisableAutoGenTag = true
			h := &doc.GenManHeader{Section: "1", Source: root.Name() + " " + version, Manual: "edge-agent manual"}
			if err := doc.GenManTree(root, h, args[0]); err != nil {
				return fmt.Errorf("man pages: %w", err)
			}
			return nil
		},
	}
}

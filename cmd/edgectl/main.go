// Command edgectl is the operator's tool for edge-agent (docs/protocol.md §4):
// `send` one fenced (optionally signed) command and await its Result,
// `watch` Results and device states, `status` of an agent's devices,
// `resolve` an unknown write, `keygen` a key pair for signed commands.
// main is wiring only.
//
// Exit status: 0 when the command was applied (or watch/status succeeded),
// 1 for any other outcome or failure, 2 for a usage error.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/edge-agent/edge-agent/internal/buildinfo"
	"github.com/edge-agent/edge-agent/internal/manpage"
)

// Version, Commit and Date are set at build time by the Makefile (-ldflags
// -X main.Version=...); `edgectl --version` prints them.
var (
	Version = "0.1.0-dev"
	Commit  = ""
	Date    = ""
)

// usageError marks an error as the user's (exit status 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }

// outcomeError is a Result that was received but not applied: the Result
// is already printed, the exit status is 1.
type outcomeError struct{ err error }

func (e *outcomeError) Error() string { return e.err.Error() }
func (e *outcomeError) Unwrap() error { return e.err }

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run executes edgectl with args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "edgectl",
		Short:         "Send fenced commands to edge-agent devices and watch them",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       Version,
	}
	root.SetVersionTemplate(buildinfo.Line("edgectl", Version, Commit, Date) + "\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	// Usage errors are typed where they arise (exit 2): a bad flag, an
	// unknown command, stray arguments. The status never depends on an
	// error's text, which may quote a device or the agent.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.AddCommand(sendCmd(), watchCmd(), statusCmd(), keygenCmd(), historyCmd(), resolveCmd(), fleetCmd())
	root.AddCommand(manpage.Command(root, Version))
	usageArgs(root)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "edgectl:", err)
	var ue *usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// usageArgs makes the argument checks of c and its subcommands return
// usage errors. A command with subcommands takes no arguments (an unknown
// subcommand) and shows its help.
func usageArgs(c *cobra.Command) {
	if c.HasSubCommands() && c.Args == nil {
		c.Args = cobra.NoArgs
		if !c.Runnable() {
			c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		}
	}
	if check := c.Args; check != nil {
		c.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return &usageError{err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		usageArgs(sub)
	}
}

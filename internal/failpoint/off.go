//go:build !failpoints

package failpoint

import "errors"

// Enabled is false: this build has no failpoints.
const Enabled = false

// ErrDisabled is returned by SetFunc in a build without failpoints.
var ErrDisabled = errors.New("failpoint: this build has no failpoints (build with -tags failpoints)")

// FromEnv does nothing in a build without failpoints: the environment
// cannot arm anything.
func FromEnv() error { return nil }

// Hit does nothing in a build without failpoints.
func Hit(point, op string) {}

// Armed is false in a build without failpoints.
func Armed(point, op string) bool { return false }

// Err is nil in a build without failpoints.
func Err(point string) error { return nil }

// SetFunc fails in a build without failpoints.
func SetFunc(point string, f func() error) (func(), error) { return func() {}, ErrDisabled }

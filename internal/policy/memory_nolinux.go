//go:build darwin || freebsd || netbsd || openbsd

package policy

// mapNoReserve: these systems do not commit anonymous memory up front.
const mapNoReserve = 0

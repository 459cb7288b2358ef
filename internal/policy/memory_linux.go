package policy

import "syscall"

const mapNoReserve = syscall.MAP_NORESERVE

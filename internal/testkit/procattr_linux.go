package mqtttest

import "syscall"

// procAttr kills the broker if the test process dies without cleaning up.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

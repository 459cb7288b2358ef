//go:build !linux

package mqtttest

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }

//go:build !linux

package rig

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }

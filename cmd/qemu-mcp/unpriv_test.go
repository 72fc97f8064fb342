package main

import "syscall"

// unprivileged runs a child as nobody, without capabilities.
func unprivileged() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
}

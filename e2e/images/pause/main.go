// Command pause is the pod sandbox ("infra") container of the e2e cluster: it holds the
// pod's namespaces open, reaps orphaned children (it is PID 1 of the pod when the pod
// shares its PID namespace) and exits on SIGINT/SIGTERM. The same job as Kubernetes'
// build/pause/linux/pause.c, written in Go so it builds from the Go toolchain alone into
// a static binary (CGO_ENABLED=0) with no registry pull.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (sandbox-operator e2e)")
		return
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every exited child so none is left a zombie.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

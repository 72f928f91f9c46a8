//go:build unix

package booking_test

import (
	"syscall"
	"time"
)

// cpuTime is the process's user and system CPU time so far: on a busy
// machine it moves less than the wall clock with other programs' load.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

package bctest

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"

	"github.com/better-compute/better-compute/internal/agent/confine"
)

// Fake guests' uids/gids: one per guest, from a range apart from bcd's
// (agent.DefaultExecIDFirst), counted across every FakeHypervisor of the
// process (dev runs all its simulated nodes in one), so two guests of one
// process never share an id until the range wraps.
const (
	GuestIDFirst = 0x78000000
	GuestIDCount = 65536
)

var guestIDNext atomic.Uint32

func nextGuestID() uint32 { return GuestIDFirst + (guestIDNext.Add(1)-1)%GuestIDCount }

// guestConfinement says, once per process, why fake guests' commands
// cannot be confined here (nil when they are): the process is not root, or
// the kernel lacks user namespaces. Unconfined, they run as this process's
// user, which is then not root.
var guestConfinement = sync.OnceValue(func() error {
	return confine.Probe(GuestIDFirst, GuestIDFirst, "")
})

// guestJail is how a fake guest's commands are confined: its own uid,
// its fs directory as working directory, a /tmp of its own, and the
// hypervisor's root (every guest's files) and the paths the node hides
// (its state directory, dev's) out of reach.
type guestJail struct {
	uid  uint32
	dir  string
	tmp  string
	hide []string
}

// command is /bin/sh -c command in the jail, or plainly when confinement
// is not available here.
func (j *guestJail) command(command string) (*exec.Cmd, bool, error) {
	if j == nil || guestConfinement() != nil {
		cmd := exec.Command("/bin/sh", "-c", command)
		if j != nil {
			cmd.Dir = j.dir
		}
		return cmd, false, nil
	}
	for _, d := range []string{j.dir, j.tmp} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, false, fmt.Errorf("guest directory: %w", err)
		}
		if err := os.Chown(d, int(j.uid), int(j.uid)); err != nil {
			return nil, false, fmt.Errorf("guest directory: %w", err)
		}
	}
	cmd, err := confine.Command(confine.Spec{Path: "/bin/sh", Argv: []string{"sh", "-c", command},
		UID: j.uid, GID: j.uid, Dir: j.dir, Tmp: j.tmp, Hide: j.hide})
	return cmd, true, err
}

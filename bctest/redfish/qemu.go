package redfish

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// QEMUConfig describes the VM a QEMUPower runs.
type QEMUConfig struct {
	// Binary is the emulator (default qemu-system-x86_64 on $PATH).
	Binary string
	// Args are the machine's arguments (default: TCG, 64 MiB, no default
	// devices, no display). The QMP monitor and -boot are added.
	Args []string
	// Dir holds the QMP socket; keep it short (a unix socket path is at most
	// 107 bytes). Default: a new directory under os.TempDir().
	Dir string
}

// QEMUPower is a QEMU VM as the machine: power on starts the QEMU process,
// power off ends it (QMP quit), a graceful shutdown presses the ACPI power
// button (QMP system_powerdown), a warm restart resets it (QMP
// system_reset). The machine is on exactly while its process runs.
type QEMUPower struct {
	cfg QEMUConfig

	mu     sync.Mutex
	cmd    *exec.Cmd
	qmp    *qmpConn
	exited chan struct{} // closed when the current process has exited
	stderr *tailBuffer
	boots  []string
}

// NewQEMUPower prepares a VM; nothing runs until On.
func NewQEMUPower(cfg QEMUConfig) (*QEMUPower, error) {
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	if len(cfg.Args) == 0 {
		cfg.Args = []string{"-accel", "tcg", "-m", "64", "-nodefaults", "-display", "none", "-serial", "none", "-parallel", "none"}
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "bcrf")
		if err != nil {
			return nil, fmt.Errorf("qemu power: %w", err)
		}
		cfg.Dir = dir
	}
	if n := len(filepath.Join(cfg.Dir, "qmp.sock")); n > 107 {
		return nil, fmt.Errorf("qemu power: the QMP socket path would be %d bytes (at most 107)", n)
	}
	return &QEMUPower{cfg: cfg}, nil
}

// qemuBoot maps a Redfish boot target to QEMU's -boot: n network, c disk,
// d CD; the BIOS setup is the closest QEMU has, the firmware's boot menu.
func qemuBoot(boot string, once bool) []string {
	dev := map[string]string{"Pxe": "n", "Hdd": "c", "Cd": "d"}[boot]
	switch {
	case boot == "BiosSetup":
		return []string{"-boot", "menu=on"}
	case dev == "":
		return nil
	case once:
		return []string{"-boot", "once=" + dev}
	default:
		return []string{"-boot", "order=" + dev}
	}
}

func (p *QEMUPower) On(ctx context.Context, boot string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked(ctx, boot)
}

func (p *QEMUPower) startLocked(ctx context.Context, boot string) error {
	if p.runningLocked() {
		return nil
	}
	sock := filepath.Join(p.cfg.Dir, "qmp.sock")
	_ = os.Remove(sock)
	// We listen and QEMU connects: no waiting for a socket to appear.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("qemu power: listen for QMP: %w", err)
	}
	defer func() { _ = ln.Close() }()
	args := slices.Clone(p.cfg.Args)
	args = append(args, "-name", "bctest-redfish",
		"-chardev", "socket,id=qmp0,path="+sock, "-mon", "chardev=qmp0,mode=control")
	args = append(args, qemuBoot(boot, true)...)
	cmd := exec.Command(p.cfg.Binary, args...)
	p.stderr = &tailBuffer{max: 4096}
	cmd.Stdout, cmd.Stderr = p.stderr, p.stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("qemu power: start %s: %w", p.cfg.Binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.cmd, p.exited = cmd, exited

	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	select {
	case c := <-accepted:
		q, err := newQMP(ctx, c)
		if err != nil {
			p.killLocked()
			return fmt.Errorf("qemu power: %w", err)
		}
		p.qmp = q
		p.boots = append(p.boots, bootName(boot))
		return nil
	case <-exited:
		return fmt.Errorf("qemu power: qemu exited at start: %s", strings.TrimSpace(p.stderr.String()))
	case <-ctx.Done():
		p.killLocked()
		return fmt.Errorf("qemu power: qemu did not connect to QMP: %w", ctx.Err())
	}
}

func (p *QEMUPower) Off(ctx context.Context, graceful bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.runningLocked() {
		return nil
	}
	if graceful {
		_, err := p.qmp.run(ctx, "system_powerdown")
		return err
	}
	p.quitLocked(ctx)
	return nil
}

func (p *QEMUPower) Restart(ctx context.Context, boot string, cold bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !cold && boot == "" && p.runningLocked() {
		_, err := p.qmp.run(ctx, "system_reset")
		return err
	}
	// QEMU cannot change its boot device across a reset: start it anew.
	p.quitLocked(ctx)
	return p.startLocked(ctx, boot)
}

func (p *QEMUPower) IsOn(context.Context) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runningLocked(), nil
}

// PID is the running QEMU process's id, 0 when the machine is off.
func (p *QEMUPower) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.runningLocked() {
		return 0
	}
	return p.cmd.Process.Pid
}

// Boots lists the boot device of every start so far ("None": its own order).
func (p *QEMUPower) Boots() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.boots)
}

// Close ends the VM, if it runs.
func (p *QEMUPower) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runningLocked() {
		p.killLocked()
	}
	return nil
}

func (p *QEMUPower) runningLocked() bool {
	if p.exited == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// quitLocked asks QEMU to quit over QMP and waits for the process to end,
// killing it if QMP fails or ctx ends first.
func (p *QEMUPower) quitLocked(ctx context.Context) {
	if !p.runningLocked() {
		return
	}
	if _, err := p.qmp.run(ctx, "quit"); err != nil {
		// QMP is broken: pull the plug instead.
		p.killLocked()
	} else {
		select {
		case <-p.exited:
		case <-ctx.Done():
			p.killLocked()
		}
	}
	p.qmp.close()
}

func (p *QEMUPower) killLocked() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	if p.qmp != nil {
		p.qmp.close()
	}
}

// qmpConn is a QMP client: JSON commands in, one reply each, asynchronous
// events skipped.
type qmpConn struct {
	c   net.Conn
	dec *json.Decoder
}

func newQMP(ctx context.Context, c net.Conn) (*qmpConn, error) {
	q := &qmpConn{c: c, dec: json.NewDecoder(bufio.NewReader(c))}
	q.deadline(ctx)
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		_ = c.Close()
		return nil, fmt.Errorf("qmp: no greeting: %w", err)
	}
	if _, err := q.run(ctx, "qmp_capabilities"); err != nil {
		_ = c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmpConn) deadline(ctx context.Context) {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Time{}
	}
	_ = q.c.SetDeadline(d)
}

func (q *qmpConn) run(ctx context.Context, command string) (json.RawMessage, error) {
	q.deadline(ctx)
	if err := json.NewEncoder(q.c).Encode(map[string]string{"execute": command}); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", command, err)
	}
	for {
		var msg struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := q.dec.Decode(&msg); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", command, err)
		}
		switch {
		case msg.Error != nil:
			return nil, fmt.Errorf("qmp %s: %s: %s", command, msg.Error.Class, msg.Error.Desc)
		case msg.Return != nil:
			return msg.Return, nil
		}
		// An event ({"event": …}): not our reply.
	}
}

func (q *qmpConn) close() { _ = q.c.Close() }

// tailBuffer keeps the last max bytes written: QEMU's last words when it
// refuses to start.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(b)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

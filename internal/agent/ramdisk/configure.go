package ramdisk

import (
	"bytes"
	"crypto/ecdsa"
	"fmt"
	"io"
	"strings"

	"github.com/better-compute/better-compute/internal/sealbox"
)

// The deployed image's config slot: a file the image's build reserved on
// its boot partition (bcd.env on the sample image's FAT partition) whose
// bytes start with SlotMagic and end with SlotEnd, SlotSize bytes in all,
// starting on a sector. machine.configure finds it on the written disk and
// rewrites it in place, the same size, so no file system code is needed
// and the partition's structures stay as the image's signer made them.
const (
	SlotMagic = "# bcd-config-slot v1\n"
	SlotEnd   = "# end of bcd-config-slot\n"
	SlotSize  = 2048
	// slotAlign: a file's data starts on a sector (every FAT cluster does).
	slotAlign = 512
)

// configureCommand writes the deployed OS's join settings into the image's
// config slot on the device: the gateway address and a single-use node
// join token. The token is never logged nor returned.
//
// Params: device, size_bytes (the image's size: only that much is
// searched), join_token_sealed (sealed to this ramdisk's key, sealbox info
// "join/<machine_id>") or join_token, server (default Config.Server),
// machine_id. A dedicated-root lease's deploy sends root_authorized_key
// instead of a token: the slot gets root's key and no server or token, so
// the lessee's OS never joins the platform.
func (r *Ramdisk) configureCommand(params map[string]any, id Identity) (map[string]any, error) {
	if key := paramString(params, "root_authorized_key"); key != "" {
		return r.configureLease(params, key)
	}
	device, token := paramString(params, "device"), paramString(params, "join_token")
	if sealed := paramString(params, "join_token_sealed"); sealed != "" {
		key, ok := id.Key.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%w: join_token_sealed: this ramdisk has no P-256 key to open it", ErrInvalidParams)
		}
		b, err := sealbox.Open(key, "join/"+paramString(params, "machine_id"), sealed)
		if err != nil {
			return nil, fmt.Errorf("%w: join_token_sealed: %w", ErrInvalidParams, err)
		}
		token = string(b)
	}
	server := paramString(params, "server")
	if server == "" {
		server = r.cfg.Server
	}
	size, _ := params["size_bytes"].(float64)
	switch {
	case device == "":
		return nil, fmt.Errorf("%w: device is required", ErrInvalidParams)
	case token == "" || !shellSafe(token):
		return nil, fmt.Errorf("%w: join_token: required, base64 or hex characters only", ErrInvalidParams)
	case server == "" || !shellSafe(server):
		return nil, fmt.Errorf("%w: server: required (host:port, or several comma-separated)", ErrInvalidParams)
	case size <= 0:
		return nil, fmt.Errorf("%w: size_bytes: must be positive", ErrInvalidParams)
	}
	machine := paramString(params, "machine_id")
	if machine != "" && !shellSafe(machine) {
		return nil, fmt.Errorf("%w: machine_id: letters, digits and _ only", ErrInvalidParams)
	}
	body := fmt.Sprintf("BCD_SERVER='%s'\nBCD_JOIN_TOKEN='%s'\n", server, token)
	if machine != "" {
		body += fmt.Sprintf("BCD_MACHINE='%s'\n", machine)
	}
	off, err := r.writeSlot(device, int64(size), body)
	if err != nil {
		return nil, err
	}
	return map[string]any{"device": device, "slot_offset": off, "server": server}, nil
}

// configureLease writes a lease's settings into the slot: root's key
// (BCD_ROOT_AUTHORIZED_KEY) and the machine, nothing to join with.
func (r *Ramdisk) configureLease(params map[string]any, key string) (map[string]any, error) {
	device, machine := paramString(params, "device"), paramString(params, "machine_id")
	size, _ := params["size_bytes"].(float64)
	switch {
	case device == "":
		return nil, fmt.Errorf("%w: device is required", ErrInvalidParams)
	case strings.ContainsAny(key, "'\\\n\r") || len(strings.Fields(key)) < 2:
		return nil, fmt.Errorf("%w: root_authorized_key: one OpenSSH public key line without quotes or backslashes", ErrInvalidParams)
	case machine != "" && !shellSafe(machine):
		return nil, fmt.Errorf("%w: machine_id: letters, digits and _ only", ErrInvalidParams)
	case size <= 0:
		return nil, fmt.Errorf("%w: size_bytes: must be positive", ErrInvalidParams)
	}
	body := fmt.Sprintf("BCD_ROOT_AUTHORIZED_KEY='%s'\n", key)
	if machine != "" {
		body += fmt.Sprintf("BCD_MACHINE='%s'\n", machine)
	}
	off, err := r.writeSlot(device, int64(size), body)
	if err != nil {
		return nil, err
	}
	return map[string]any{"device": device, "slot_offset": off, "root_authorized_key": true}, nil
}

// writeSlot finds the image's config slot within its first size bytes on
// device and rewrites it with body.
func (r *Ramdisk) writeSlot(device string, size int64, body string) (int64, error) {
	dst, err := r.open(device)
	if err != nil {
		return 0, err
	}
	defer dst.f.Close()
	off, err := findSlot(io.NewSectionReader(dst.f, 0, min(size, dst.size)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", device, err)
	}
	slot, err := renderSlot(body)
	if err != nil {
		return 0, err
	}
	if _, err := dst.f.WriteAt(slot, off); err != nil {
		return 0, fmt.Errorf("write the config slot on %s: %w", device, err)
	}
	if err := dst.f.Sync(); err != nil {
		return 0, fmt.Errorf("sync %s: %w", device, err)
	}
	return off, nil
}

// findSlot returns the offset of the one config slot in r.
func findSlot(r *io.SectionReader) (int64, error) {
	buf := make([]byte, 1<<20)
	found := int64(-1)
	for base := int64(0); base < r.Size(); base += int64(len(buf)) {
		n, err := r.ReadAt(buf, base)
		if err != nil && err != io.EOF {
			return 0, err
		}
		for i := 0; i+len(SlotMagic) <= n; i += slotAlign {
			if !bytes.HasPrefix(buf[i:n], []byte(SlotMagic)) {
				continue
			}
			if found >= 0 {
				return 0, fmt.Errorf("%w: the image has more than one config slot", ErrInvalidParams)
			}
			found = base + int64(i)
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("%w: the image has no config slot (%q on a sector); it cannot be configured to join", ErrInvalidParams, strings.TrimSpace(SlotMagic))
	}
	// The slot must be one run of bytes: its end marker where it belongs.
	end := make([]byte, len(SlotEnd))
	if _, err := r.ReadAt(end, found+SlotSize-int64(len(SlotEnd))); err != nil || string(end) != SlotEnd {
		return 0, fmt.Errorf("%w: the config slot at %d is not %d contiguous bytes", ErrInvalidParams, found, SlotSize)
	}
	return found, nil
}

// renderSlot pads body to the slot's size between its markers: the padding
// is a shell comment, so the file stays a valid env file.
func renderSlot(body string) ([]byte, error) {
	pad := SlotSize - len(SlotMagic) - len(body) - len(SlotEnd)
	if pad < 2 {
		return nil, fmt.Errorf("%w: the settings (%d bytes) do not fit the %d-byte config slot", ErrInvalidParams, len(body), SlotSize)
	}
	var b bytes.Buffer
	b.WriteString(SlotMagic)
	b.WriteString(body)
	b.WriteString("#" + strings.Repeat(" ", pad-2) + "\n")
	b.WriteString(SlotEnd)
	return b.Bytes(), nil
}

// shellSafe accepts what may sit inside single quotes in the env file the
// image's init sources: token, address and id characters.
func shellSafe(s string) bool {
	if len(s) > 1024 {
		return false
	}
	for _, c := range s {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.~+/=:[],", c)
		if !ok {
			return false
		}
	}
	return true
}

// EmptySlot is the config slot as an image's build writes it: markers and
// padding, no settings (deploy/images/build-sample.sh writes the same).
func EmptySlot() []byte {
	b, _ := renderSlot("")
	return b
}

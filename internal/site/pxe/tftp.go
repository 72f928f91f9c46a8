package pxe

import (
	"fmt"
	"io"
	"slices"

	"github.com/pin/tftp/v3"
)

// tftpRead serves a read request. Only the configured chainload names are
// answered, matched exactly (a PXE ROM asks for the name DHCP gave it), and
// opened through an os.Root on BootDir, so neither "../" nor a symlink out of
// the directory reaches another file. Any other name gets a TFTP error.
func (s *Server) tftpRead(filename string, rf io.ReaderFrom) error {
	peer := ""
	if t, ok := rf.(tftp.OutgoingTransfer); ok {
		addr := t.RemoteAddr()
		peer = addr.String()
	}
	if !slices.Contains(s.chainNames(), filename) {
		s.log.Warn("tftp request refused", "file", filename, "peer", peer)
		return errNotChainload
	}
	f, err := s.bootRoot.Open(filename)
	if err != nil {
		s.log.Error("tftp chainload binary missing", "file", filename, "err", err)
		return fmt.Errorf("file not found: %s", filename)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("file not found: %s", filename)
	}
	if t, ok := rf.(tftp.OutgoingTransfer); ok {
		// PXE ROMs ask for tsize before they allocate.
		t.SetSize(st.Size())
	}
	n, err := rf.ReadFrom(f)
	if err != nil {
		s.log.Warn("tftp transfer failed", "file", filename, "peer", peer, "sent", n, "err", err)
		return err
	}
	s.log.Info("tftp chainload sent", "file", filename, "peer", peer, "bytes", n)
	return nil
}

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Default range of the uids/gids bcd gives allocations' processes: above
// what systemd hands to containers (0x00080000–0x6FFFFFFF) and below
// 2^31, which some tools read as negative. One bcd per host owns it.
const (
	DefaultExecIDFirst = 0x70000000
	DefaultExecIDCount = 65536
)

// execIDsFile maps each allocation to its uid (= gid), so the id survives
// a restart of bcd and is given to no other allocation until release.
const execIDsFile = "exec-ids.json"

// reservationsDir holds each allocation's own files (<id>/tmp, its /tmp):
// under the state directory, which every confined process has hidden.
const reservationsDir = "reservations"

// execIDs allocates the uid/gid of each allocation's processes from
// [first, first+count).
type execIDs struct {
	mu           sync.Mutex
	dir          stateDir
	first, count uint32
	loaded       bool
	ids          map[string]uint32
}

func (e *execIDs) loadLocked() error {
	if e.loaded {
		return nil
	}
	var f struct {
		IDs map[string]uint32 `json:"ids"`
	}
	if _, err := e.dir.readJSON(execIDsFile, &f); err != nil {
		return err
	}
	e.ids = f.IDs
	if e.ids == nil {
		e.ids = map[string]uint32{}
	}
	e.loaded = true
	return nil
}

func (e *execIDs) saveLocked() error {
	return e.dir.writeJSON(execIDsFile, struct {
		IDs map[string]uint32 `json:"ids"`
	}{e.ids})
}

// get returns the allocation's id, allocating the lowest free one on first
// use.
func (e *execIDs) get(allocationID string) (uint32, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.loadLocked(); err != nil {
		return 0, err
	}
	if id, ok := e.ids[allocationID]; ok {
		return id, nil
	}
	used := make(map[uint32]bool, len(e.ids))
	for _, id := range e.ids {
		used[id] = true
	}
	for i := range e.count {
		id := e.first + i
		if used[id] {
			continue
		}
		e.ids[allocationID] = id
		if err := e.saveLocked(); err != nil {
			delete(e.ids, allocationID)
			return 0, err
		}
		return id, nil
	}
	return 0, fmt.Errorf("all %d process ids from %d are given to allocations on this node", e.count, e.first)
}

// free gives the allocation's id back (after its processes were killed).
func (e *execIDs) free(allocationID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.loadLocked(); err != nil {
		return err
	}
	if _, ok := e.ids[allocationID]; !ok {
		return nil
	}
	delete(e.ids, allocationID)
	return e.saveLocked()
}

// allocationDir is the directory of the allocation's own files.
func (a *Agent) allocationDir(allocationID string) string {
	return filepath.Join(string(a.dir), reservationsDir, allocationID)
}

// allocationTmp makes the allocation's /tmp (owned by its id, 0700) and
// returns its host path.
func (a *Agent) allocationTmp(allocationID string, id uint32) (string, error) {
	dir := a.allocationDir(allocationID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("allocation directory: %w", err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("allocation tmp: %w", err)
	}
	if err := os.Chown(tmp, int(id), int(id)); err != nil {
		return "", fmt.Errorf("allocation tmp: %w", err)
	}
	return tmp, nil
}

// releaseFiles removes the allocation's files and gives its id back; its
// processes are gone by now (the cgroup was killed).
func (a *Agent) releaseFiles(allocationID string) error {
	if err := os.RemoveAll(a.allocationDir(allocationID)); err != nil {
		return fmt.Errorf("remove the allocation's files: %w", err)
	}
	return a.ids.free(allocationID)
}

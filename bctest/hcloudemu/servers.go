package hcloudemu

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// maxUserData is the API's limit on a server's user data.
const maxUserData = 32 << 10

// hostnameRE is a server name: an RFC 1123 hostname, as the API requires.
var hostnameRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$`)

func sortByID[T any](items []T, id func(T) int64) {
	sort.Slice(items, func(i, j int) bool { return id(items[i]) < id(items[j]) })
}

func (s *Server) schemaServerLocked(srv *server) schema.Server {
	st, _ := serverTypeByName(srv.serverType)
	loc, _ := locationByName(srv.location)
	dc := schemaDatacenter(loc)
	out := schema.Server{
		ID: srv.id, Name: srv.name, Status: srv.status, Created: srv.created,
		PublicNet: schema.ServerPublicNet{
			IPv4:        schema.ServerPublicNetIPv4{ID: srv.id + 1, IP: srv.ipv4, DNSPtr: "static." + srv.ipv4 + ".clients.your-server.de"},
			IPv6:        schema.ServerPublicNetIPv6{ID: srv.id + 2, IP: srv.ipv6, DNSPtr: []schema.ServerPublicNetIPv6DNSPtr{}},
			FloatingIPs: []int64{},
			Firewalls:   []schema.ServerFirewall{},
		},
		PrivateNet:      []schema.ServerPrivateNet{},
		ServerType:      schemaServerType(st),
		IncludedTraffic: 20 << 40,
		Location:        schemaLocation(loc),
		Labels:          copyLabels(srv.labels),
		Volumes:         []int64{},
		PrimaryDiskSize: st.disk,
		LoadBalancers:   []int64{},
		// Older clients (hcloud-cli 1.30's server list) still read the
		// datacenter the API has phased out.
		Datacenter: &dc, //nolint:staticcheck // see above
	}
	if img, ok := imageByID(srv.image); ok {
		si := schemaImage(img)
		out.Image = &si
	}
	for i, nid := range srv.networks {
		if n, ok := s.networks[nid]; ok {
			out.PrivateNet = append(out.PrivateNet, schema.ServerPrivateNet{
				Network: nid, IP: privateIP(n.ipRange, srv.id), AliasIPs: []string{},
				MACAddress: fmt.Sprintf("86:00:00:%02x:%02x:%02x", byte(srv.id>>8), byte(srv.id), byte(i)),
			})
		}
	}
	return out
}

// privateIP gives a server a stable address in a network's range.
func privateIP(cidr string, id int64) string {
	ip, _, err := net.ParseCIDR(cidr)
	if err != nil || ip.To4() == nil {
		return ""
	}
	v4 := ip.To4()
	return fmt.Sprintf("%d.%d.%d.%d", v4[0], v4[1], byte(id>>8), byte(id)|2)
}

func schemaAction(a *action) schema.Action {
	out := schema.Action{
		ID: a.id, Status: a.status, Command: a.command, Started: a.started,
		Resources: []schema.ActionResourceReference{{ID: a.serverID, Type: "server"}},
	}
	if a.status != "running" {
		out.Progress = 100
		finished := a.finished
		out.Finished = &finished
	}
	return out
}

func (s *Server) listServers(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sel, ok := labelFilter(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	var list []*server
	for _, srv := range s.sortedServersLocked() {
		if !sel.matches(srv.labels) {
			continue
		}
		if statuses := q["status"]; len(statuses) > 0 && !contains(statuses, srv.status) {
			continue
		}
		list = append(list, srv)
	}
	list = byName(r, list, func(srv *server) string { return srv.name })
	if err := sortServers(list, q["sort"]); err != nil {
		s.mu.Unlock()
		invalid(w, "sort", err.Error())
		return
	}
	page, m, ok := pageOf(w, r, list, s.pageSize)
	if !ok {
		s.mu.Unlock()
		return
	}
	out := make([]schema.Server, 0, len(page))
	for _, srv := range page {
		s.settleServerLocked(srv.id)
		out = append(out, s.schemaServerLocked(srv))
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"servers": out, "meta": m})
}

// sortServers orders a listing as its sort parameters ask ("id", "name",
// "created", each with an optional ":asc" or ":desc").
func sortServers(list []*server, sorts []string) error {
	for i := len(sorts) - 1; i >= 0; i-- {
		field, dir, _ := strings.Cut(sorts[i], ":")
		if dir != "" && dir != "asc" && dir != "desc" {
			return fmt.Errorf("sort direction %q is invalid", dir)
		}
		var less func(a, b *server) bool
		switch field {
		case "id":
			less = func(a, b *server) bool { return a.id < b.id }
		case "name":
			less = func(a, b *server) bool { return a.name < b.name }
		case "created":
			less = func(a, b *server) bool { return a.created.Before(b.created) }
		default:
			return fmt.Errorf("cannot sort by %q", field)
		}
		if dir == "desc" {
			asc := less
			less = func(a, b *server) bool { return asc(b, a) }
		}
		sort.SliceStable(list, func(i, j int) bool { return less(list[i], list[j]) })
	}
	return nil
}

// serverFor finds the server of the path's id and answers not_found when
// there is none.
func (s *Server) serverForLocked(w http.ResponseWriter, r *http.Request) (*server, bool) {
	id, ok := pathID(w, r, "id", "server")
	if !ok {
		return nil, false
	}
	srv, ok := s.servers[id]
	if !ok {
		notFound(w, "server", r.PathValue("id"))
		return nil, false
	}
	return srv, true
}

func (s *Server) getServer(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	srv, ok := s.serverForLocked(w, r)
	if !ok {
		return
	}
	s.settleServerLocked(srv.id)
	writeJSON(w, http.StatusOK, map[string]any{"server": s.schemaServerLocked(srv)})
}

func (s *Server) createServer(w http.ResponseWriter, r *http.Request) {
	var req schema.ServerCreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "json_error", "request body is no valid JSON")
		return
	}
	if req.Name == "" || len(req.Name) > 63 || !hostnameRE.MatchString(req.Name) {
		invalid(w, "name", "must be a valid hostname")
		return
	}
	st, ok := serverTypeByName(req.ServerType.Name)
	if req.ServerType.ID != 0 {
		st, ok = serverTypeByID(req.ServerType.ID)
	}
	if !ok {
		invalid(w, "server_type", "server type not found")
		return
	}
	loc, ok := s.placement(req, st)
	if !ok {
		invalid(w, "location", "location not found or server type not available there")
		return
	}
	img, ok := imageFor(req.Image, st.architecture)
	if !ok {
		invalid(w, "image", "image not found for the server type's architecture")
		return
	}
	if len(req.UserData) > maxUserData {
		invalid(w, "user_data", "must be at most 32 KiB")
		return
	}
	labels := map[string]string{}
	if req.Labels != nil {
		labels = copyLabels(*req.Labels)
	}
	for k, v := range labels {
		if err := validLabel(k, v); err != nil {
			invalid(w, "labels", err.Error())
			return
		}
	}
	start := req.StartAfterCreate == nil || *req.StartAfterCreate

	s.mu.Lock()
	for _, id := range req.SSHKeys {
		if _, ok := s.sshKeys[id]; !ok {
			s.mu.Unlock()
			invalid(w, "ssh_keys", fmt.Sprintf("SSH key %d not found", id))
			return
		}
	}
	for _, id := range req.Networks {
		if _, ok := s.networks[id]; !ok {
			s.mu.Unlock()
			invalid(w, "networks", fmt.Sprintf("network %d not found", id))
			return
		}
	}
	for _, other := range s.servers {
		if other.name == req.Name {
			s.mu.Unlock()
			writeError(w, http.StatusConflict, "uniqueness_error", "server name is already used")
			return
		}
	}
	srv := &server{
		id: s.newIDLocked(), name: req.Name, status: "initializing", created: time.Now().UTC(),
		serverType: st.name, location: loc.name, image: img.id, labels: labels, userData: req.UserData,
		sshKeys: append([]int64(nil), req.SSHKeys...), networks: append([]int64(nil), req.Networks...),
	}
	srv.ipv4 = fmt.Sprintf("203.0.%d.%d", byte(srv.id>>8)&0x3f|0x40, byte(srv.id))
	srv.ipv6 = fmt.Sprintf("2001:db8:%x::/64", srv.id&0xffff)
	s.servers[srv.id] = srv
	var create *action
	var next []schema.Action
	if start {
		create = s.newActionLocked("create_server", srv.id, "starting")
		next = append(next, schemaAction(s.newActionLocked("start_server", srv.id, "running")))
	} else {
		create = s.newActionLocked("create_server", srv.id, "off")
	}
	resp := schema.ServerCreateResponse{Server: s.schemaServerLocked(srv), Action: schemaAction(create), NextActions: append([]schema.Action{}, next...)}
	lose := s.loseCreate
	s.loseCreate = false
	s.mu.Unlock()

	if lose {
		// The create took effect; its answer never leaves.
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	if len(req.SSHKeys) == 0 {
		// Without a key the API mails nothing and answers a password.
		pw := randomToken()[:20]
		resp.RootPassword = &pw
	}
	writeJSON(w, http.StatusCreated, resp)
}

// placement is the create's location: the location (by name or id), the
// datacenter's, or the first that offers the server type.
func (s *Server) placement(req schema.ServerCreateRequest, st serverType) (location, bool) {
	var loc location
	var ok bool
	switch {
	case req.Location != "":
		loc, ok = locationByName(req.Location)
		if !ok {
			for _, l := range catalogLocations {
				if fmt.Sprint(l.id) == req.Location {
					loc, ok = l, true
				}
			}
		}
	case req.Datacenter != "": //nolint:staticcheck // older clients place by datacenter
		loc, ok = locationByDatacenter(req.Datacenter) //nolint:staticcheck // as above
	default:
		for _, l := range catalogLocations {
			if st.offeredIn(l.name) {
				return l, true
			}
		}
	}
	return loc, ok && st.offeredIn(loc.name)
}

func (s *Server) updateServer(w http.ResponseWriter, r *http.Request) {
	var req schema.ServerUpdateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "json_error", "request body is no valid JSON")
		return
	}
	if req.Name != "" && (len(req.Name) > 63 || !hostnameRE.MatchString(req.Name)) {
		invalid(w, "name", "must be a valid hostname")
		return
	}
	if req.Labels != nil {
		for k, v := range *req.Labels {
			if err := validLabel(k, v); err != nil {
				invalid(w, "labels", err.Error())
				return
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	srv, ok := s.serverForLocked(w, r)
	if !ok {
		return
	}
	if req.Name != "" && req.Name != srv.name {
		for _, other := range s.servers {
			if other.name == req.Name {
				writeError(w, http.StatusConflict, "uniqueness_error", "server name is already used")
				return
			}
		}
		srv.name = req.Name
	}
	if req.Labels != nil {
		srv.labels = copyLabels(*req.Labels)
	}
	writeJSON(w, http.StatusOK, map[string]any{"server": s.schemaServerLocked(srv)})
}

func (s *Server) deleteServer(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	srv, ok := s.serverForLocked(w, r)
	if !ok {
		return
	}
	// The server leaves at once; its delete action still answers, so a
	// client may wait on it.
	a := s.newActionLocked("delete_server", srv.id, "")
	delete(s.servers, srv.id)
	writeJSON(w, http.StatusOK, map[string]any{"action": schemaAction(a)})
}

// serverCommands maps a server action's path to its command, the status
// while it runs ("" keeps the server's) and the status it leaves.
var serverCommands = map[string]struct{ command, during, after string }{
	"poweron":  {"start_server", "starting", "running"},
	"poweroff": {"stop_server", "stopping", "off"},
	"shutdown": {"shutdown_server", "stopping", "off"},
	"reboot":   {"reboot_server", "", "running"},
	"reset":    {"reset_server", "", "running"},
	"rebuild":  {"rebuild_server", "rebuilding", "running"},
}

func (s *Server) serverAction(w http.ResponseWriter, r *http.Request) {
	cmd, ok := serverCommands[r.PathValue("command")]
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", "the requested resource does not exist")
		return
	}
	var rebuild schema.ServerActionRebuildRequest
	if r.PathValue("command") == "rebuild" {
		if err := json.NewDecoder(r.Body).Decode(&rebuild); err != nil {
			writeError(w, http.StatusBadRequest, "json_error", "request body is no valid JSON")
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	srv, ok := s.serverForLocked(w, r)
	if !ok {
		return
	}
	resp := map[string]any{}
	if r.PathValue("command") == "rebuild" {
		st, _ := serverTypeByName(srv.serverType)
		img, ok := imageFor(rebuild.Image, st.architecture)
		if !ok {
			invalid(w, "image", "image not found for the server type's architecture")
			return
		}
		if rebuild.UserData != nil {
			if len(*rebuild.UserData) > maxUserData {
				invalid(w, "user_data", "must be at most 32 KiB")
				return
			}
			srv.userData = *rebuild.UserData
		}
		srv.image = img.id
		resp["root_password"] = nil
	}
	// Earlier actions are over once another starts: the API would have
	// answered "locked" until then.
	s.settleServerLocked(srv.id)
	if cmd.during != "" {
		srv.status = cmd.during
	}
	resp["action"] = schemaAction(s.newActionLocked(cmd.command, srv.id, cmd.after))
	writeJSON(w, http.StatusCreated, resp)
}

// readActionLocked finishes an action being read and renders it.
func (s *Server) readActionLocked(a *action) schema.Action {
	s.finishLocked(a)
	return schemaAction(a)
}

func (s *Server) getAction(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "action", "action")
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.actions[id]
	if !ok {
		notFound(w, "action", r.PathValue("action"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": s.readActionLocked(a)})
}

func (s *Server) getServerAction(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "action", "action")
	if !ok {
		return
	}
	sid, ok := pathID(w, r, "id", "server")
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.actions[id]
	if !ok || a.serverID != sid {
		notFound(w, "action", r.PathValue("action"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": s.readActionLocked(a)})
}

// listActions answers /actions and /servers/actions: filtered by id and
// status, sorted by id (the sort parameter "status" orders running first).
func (s *Server) listActions(w http.ResponseWriter, r *http.Request) {
	s.listActionsOf(w, r, 0)
}

func (s *Server) listServerActions(w http.ResponseWriter, r *http.Request) {
	sid, ok := pathID(w, r, "id", "server")
	if !ok {
		return
	}
	s.listActionsOf(w, r, sid)
}

func (s *Server) listActionsOf(w http.ResponseWriter, r *http.Request, serverID int64) {
	q := r.URL.Query()
	ids := map[int64]bool{}
	for _, v := range q["id"] {
		var id int64
		if _, err := fmt.Sscan(v, &id); err != nil {
			invalid(w, "id", "must be an integer")
			return
		}
		ids[id] = true
	}
	s.mu.Lock()
	var list []*action
	for _, a := range s.actions {
		if (len(ids) == 0 || ids[a.id]) && (serverID == 0 || a.serverID == serverID) {
			list = append(list, a)
		}
	}
	// Finish in id order, so that a later action's status wins.
	sortByID(list, func(a *action) int64 { return a.id })
	out := make([]schema.Action, 0, len(list))
	for _, a := range list {
		s.finishLocked(a)
		if statuses := q["status"]; len(statuses) == 0 || contains(statuses, a.status) {
			out = append(out, schemaAction(a))
		}
	}
	s.mu.Unlock()
	page, m, ok := pageOf(w, r, out, s.PageSize())
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"actions": append([]schema.Action{}, page...), "meta": m})
}

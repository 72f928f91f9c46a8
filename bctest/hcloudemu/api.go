package hcloudemu

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// rateLimit is the project's request budget per hour; the API refills it
// by one request each 3600/rateLimit seconds.
const rateLimit = 3600

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/servers", s.listServers)
	mux.HandleFunc("POST /v1/servers", s.createServer)
	mux.HandleFunc("GET /v1/servers/{id}", s.getServer)
	mux.HandleFunc("PUT /v1/servers/{id}", s.updateServer)
	mux.HandleFunc(http.MethodDelete+" /v1/servers/{id}", s.deleteServer)
	mux.HandleFunc("POST /v1/servers/{id}/actions/{command}", s.serverAction)
	mux.HandleFunc("GET /v1/servers/{id}/actions/{action}", s.getServerAction)
	mux.HandleFunc("GET /v1/servers/{id}/actions", s.listServerActions)
	mux.HandleFunc("GET /v1/servers/actions", s.listActions)
	mux.HandleFunc("GET /v1/actions", s.listActions)
	mux.HandleFunc("GET /v1/actions/{action}", s.getAction)
	mux.HandleFunc("GET /v1/server_types", s.listServerTypes)
	mux.HandleFunc("GET /v1/server_types/{id}", s.getServerType)
	mux.HandleFunc("GET /v1/locations", s.listLocations)
	mux.HandleFunc("GET /v1/locations/{id}", s.getLocation)
	mux.HandleFunc("GET /v1/datacenters", s.listDatacenters)
	mux.HandleFunc("GET /v1/datacenters/{id}", s.getDatacenter)
	mux.HandleFunc("GET /v1/images", s.listImages)
	mux.HandleFunc("GET /v1/images/{id}", s.getImage)
	mux.HandleFunc("GET /v1/ssh_keys", s.listSSHKeys)
	mux.HandleFunc("POST /v1/ssh_keys", s.createSSHKey)
	mux.HandleFunc("GET /v1/ssh_keys/{id}", s.getSSHKey)
	mux.HandleFunc(http.MethodDelete+" /v1/ssh_keys/{id}", s.deleteSSHKey)
	mux.HandleFunc("GET /v1/networks", s.listNetworks)
	mux.HandleFunc("GET /v1/networks/{id}", s.getNetwork)
	mux.HandleFunc("GET /v1/pricing", s.getPricing)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "the requested resource does not exist")
	})
	return s.guard(mux)
}

// guard plays the project's limits and injected failures, then checks the
// token, before a request reaches its handler.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		limited := s.rateLimited > 0
		if limited {
			s.rateLimited--
		}
		var fail *failure
		if !limited && len(s.failures) > 0 {
			fail = &s.failures[0]
			s.failures = s.failures[1:]
		}
		s.mu.Unlock()

		now := time.Now()
		h := w.Header()
		h.Set("RateLimit-Limit", strconv.Itoa(rateLimit))
		if limited {
			// The bucket is empty: it is full again a whole window later.
			h.Set("RateLimit-Remaining", "0")
			h.Set("RateLimit-Reset", strconv.FormatInt(now.Add(time.Hour).Unix(), 10))
			writeError(w, http.StatusTooManyRequests, "rate_limit_exceeded", "limit of 3600 requests per hour reached")
			return
		}
		h.Set("RateLimit-Remaining", strconv.Itoa(rateLimit-1))
		h.Set("RateLimit-Reset", strconv.FormatInt(now.Add(time.Second).Unix(), 10))
		if fail != nil {
			writeError(w, fail.status, codeForStatus(fail.status), fail.body)
			return
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(token), []byte(s.token)) != 1 {
			writeError(w, http.StatusUnauthorized, "unauthorized", "unable to authenticate")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// codeForStatus is the error code Hetzner answers with a status.
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return "invalid_input"
	case http.StatusUnauthorized:
		return "unauthorized"
	case http.StatusForbidden:
		return "forbidden"
	case http.StatusNotFound:
		return "not_found"
	case http.StatusConflict:
		return "conflict"
	case http.StatusPreconditionFailed:
		return "resource_unavailable"
	case http.StatusLocked:
		return "locked"
	case http.StatusTooManyRequests:
		return "rate_limit_exceeded"
	case http.StatusServiceUnavailable, http.StatusBadGateway:
		return "unavailable"
	case http.StatusGatewayTimeout:
		return "timeout"
	}
	return "server_error"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": message, "details": map[string]any{}}})
}

// invalid answers invalid_input naming the field, as the API does.
func invalid(w http.ResponseWriter, field, message string) {
	writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
		"code":    "invalid_input",
		"message": "invalid input in field '" + field + "'",
		"details": map[string]any{"fields": []map[string]any{{"name": field, "messages": []string{message}}}},
	}})
}

func notFound(w http.ResponseWriter, kind string, id string) {
	writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("%s with ID '%s' not found", kind, id))
}

// pagination is meta.pagination; absent neighbours are null.
type pagination struct {
	Page         int  `json:"page"`
	PerPage      int  `json:"per_page"`
	PreviousPage *int `json:"previous_page"`
	NextPage     *int `json:"next_page"`
	LastPage     int  `json:"last_page"`
	TotalEntries int  `json:"total_entries"`
}

type meta struct {
	Pagination pagination `json:"pagination"`
}

// pageOf cuts one page out of items as page and per_page ask; per_page is
// capped at the emulator's page size (the API's own cap is 50).
func pageOf[T any](w http.ResponseWriter, r *http.Request, items []T, pageSize int) ([]T, meta, bool) {
	q := r.URL.Query()
	page, perPage := 1, 25
	if v := q.Get("page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			invalid(w, "page", "must be a positive integer")
			return nil, meta{}, false
		}
		page = n
	}
	if v := q.Get("per_page"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			invalid(w, "per_page", "must be a positive integer")
			return nil, meta{}, false
		}
		perPage = min(n, 50)
	}
	perPage = min(perPage, pageSize)
	total := len(items)
	last := max(1, (total+perPage-1)/perPage)
	p := pagination{Page: page, PerPage: perPage, LastPage: last, TotalEntries: total}
	if page > 1 {
		prev := min(page-1, last)
		p.PreviousPage = &prev
	}
	if page < last {
		next := page + 1
		p.NextPage = &next
	}
	lo := min((page-1)*perPage, total)
	hi := min(lo+perPage, total)
	return items[lo:hi], meta{Pagination: p}, true
}

// labelFilter parses label_selector; ok is false when it answered an error.
func labelFilter(w http.ResponseWriter, r *http.Request) (selector, bool) {
	sel, err := parseSelector(r.URL.Query().Get("label_selector"))
	if err != nil {
		invalid(w, "label_selector", err.Error())
		return nil, false
	}
	return sel, true
}

func pathID(w http.ResponseWriter, r *http.Request, name, kind string) (int64, bool) {
	v := r.PathValue(name)
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 {
		notFound(w, kind, v)
		return 0, false
	}
	return id, true
}

// byName keeps the items whose name is the query's name, if it has one.
func byName[T any](r *http.Request, items []T, name func(T) string) []T {
	want, ok := r.URL.Query()["name"]
	if !ok {
		return items
	}
	var out []T
	for _, it := range items {
		if name(it) == want[0] {
			out = append(out, it)
		}
	}
	return out
}

func (s *Server) listServerTypes(w http.ResponseWriter, r *http.Request) {
	items := byName(r, slices.Clone(catalogServerTypes), func(st serverType) string { return st.name })
	sortByID(items, func(st serverType) int64 { return st.id })
	page, m, ok := pageOf(w, r, items, s.PageSize())
	if !ok {
		return
	}
	out := make([]schema.ServerType, 0, len(page))
	for _, st := range page {
		out = append(out, schemaServerType(st))
	}
	writeJSON(w, http.StatusOK, map[string]any{"server_types": out, "meta": m})
}

func (s *Server) getServerType(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "server_type")
	if !ok {
		return
	}
	st, ok := serverTypeByID(id)
	if !ok {
		notFound(w, "server_type", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"server_type": schemaServerType(st)})
}

func (s *Server) listLocations(w http.ResponseWriter, r *http.Request) {
	items := byName(r, catalogLocations, func(l location) string { return l.name })
	page, m, ok := pageOf(w, r, items, s.PageSize())
	if !ok {
		return
	}
	out := make([]schema.Location, 0, len(page))
	for _, l := range page {
		out = append(out, schemaLocation(l))
	}
	writeJSON(w, http.StatusOK, map[string]any{"locations": out, "meta": m})
}

func (s *Server) getLocation(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "location")
	if !ok {
		return
	}
	for _, l := range catalogLocations {
		if l.id == id {
			writeJSON(w, http.StatusOK, map[string]any{"location": schemaLocation(l)})
			return
		}
	}
	notFound(w, "location", r.PathValue("id"))
}

func (s *Server) listDatacenters(w http.ResponseWriter, r *http.Request) {
	items := byName(r, slices.Clone(catalogLocations), func(l location) string { return l.datacenter })
	sortByID(items, func(l location) int64 { return l.datacenterID })
	page, m, ok := pageOf(w, r, items, s.PageSize())
	if !ok {
		return
	}
	out := make([]schema.Datacenter, 0, len(page))
	for _, l := range page {
		out = append(out, schemaDatacenter(l))
	}
	writeJSON(w, http.StatusOK, map[string]any{"datacenters": out, "meta": m})
}

func (s *Server) getDatacenter(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "datacenter")
	if !ok {
		return
	}
	for _, l := range catalogLocations {
		if l.datacenterID == id {
			writeJSON(w, http.StatusOK, map[string]any{"datacenter": schemaDatacenter(l)})
			return
		}
	}
	notFound(w, "datacenter", r.PathValue("id"))
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sel, ok := labelFilter(w, r)
	if !ok {
		return
	}
	var items []image
	for _, img := range byName(r, catalogImages, func(img image) string { return img.name }) {
		if archs := q["architecture"]; len(archs) > 0 && !contains(archs, img.architecture) {
			continue
		}
		if types := q["type"]; len(types) > 0 && !contains(types, "system") {
			continue
		}
		// System images carry no labels: a selector matches them as such.
		if !sel.matches(map[string]string{}) {
			continue
		}
		items = append(items, img)
	}
	sortByID(items, func(img image) int64 { return img.id })
	page, m, ok := pageOf(w, r, items, s.PageSize())
	if !ok {
		return
	}
	out := make([]schema.Image, 0, len(page))
	for _, img := range page {
		out = append(out, schemaImage(img))
	}
	writeJSON(w, http.StatusOK, map[string]any{"images": out, "meta": m})
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "image")
	if !ok {
		return
	}
	img, ok := imageByID(id)
	if !ok {
		notFound(w, "image", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"image": schemaImage(img)})
}

func (s *Server) getPricing(w http.ResponseWriter, r *http.Request) {
	types := make([]schema.PricingServerType, 0, len(catalogServerTypes))
	for _, st := range catalogServerTypes {
		types = append(types, schema.PricingServerType{ID: st.id, Name: st.name, Prices: schemaServerTypePrices(st)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"pricing": schema.Pricing{
		Currency:          "EUR",
		VATRate:           "19.00",
		Image:             schema.PricingImage{PricePerGBMonth: schemaPrice(120)},
		FloatingIPs:       []schema.PricingFloatingIPType{},
		PrimaryIPs:        []schema.PricingPrimaryIP{},
		ServerBackup:      schema.PricingServerBackup{Percentage: "20.00"},
		ServerTypes:       types,
		Volume:            schema.PricingVolume{PricePerGBPerMonth: schemaPrice(440)},
		LoadBalancerTypes: []schema.PricingLoadBalancerType{},
	}})
}

func (s *Server) schemaSSHKeyLocked(k *sshKey) schema.SSHKey {
	return schema.SSHKey{ID: k.id, Name: k.name, Fingerprint: k.fingerprint, PublicKey: k.publicKey, Labels: copyLabels(k.labels), Created: k.created}
}

func copyLabels(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (s *Server) listSSHKeys(w http.ResponseWriter, r *http.Request) {
	sel, ok := labelFilter(w, r)
	if !ok {
		return
	}
	fp, byFingerprint := r.URL.Query()["fingerprint"]
	s.mu.Lock()
	var keys []schema.SSHKey
	for _, k := range s.sshKeysSortedLocked() {
		if sel.matches(k.labels) && (!byFingerprint || k.fingerprint == fp[0]) {
			keys = append(keys, s.schemaSSHKeyLocked(k))
		}
	}
	s.mu.Unlock()
	keys = byName(r, keys, func(k schema.SSHKey) string { return k.Name })
	page, m, ok := pageOf(w, r, keys, s.PageSize())
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ssh_keys": append([]schema.SSHKey{}, page...), "meta": m})
}

func (s *Server) sshKeysSortedLocked() []*sshKey {
	out := make([]*sshKey, 0, len(s.sshKeys))
	for _, k := range s.sshKeys {
		out = append(out, k)
	}
	sortByID(out, func(k *sshKey) int64 { return k.id })
	return out
}

func (s *Server) getSSHKey(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "ssh_key")
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.sshKeys[id]
	if !ok {
		notFound(w, "ssh_key", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ssh_key": s.schemaSSHKeyLocked(k)})
}

func (s *Server) createSSHKey(w http.ResponseWriter, r *http.Request) {
	var req schema.SSHKeyCreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "json_error", "request body is no valid JSON")
		return
	}
	if req.Name == "" {
		invalid(w, "name", "is required")
		return
	}
	fp := fingerprint(req.PublicKey)
	if fp == "" {
		invalid(w, "public_key", "is no valid OpenSSH public key")
		return
	}
	labels := map[string]string{}
	if req.Labels != nil {
		labels = *req.Labels
	}
	for k, v := range labels {
		if err := validLabel(k, v); err != nil {
			invalid(w, "labels", err.Error())
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.sshKeys {
		if k.name == req.Name || k.fingerprint == fp {
			writeError(w, http.StatusConflict, "uniqueness_error", "SSH key with the same name or fingerprint already exists")
			return
		}
	}
	k := &sshKey{id: s.newIDLocked(), name: req.Name, publicKey: req.PublicKey, fingerprint: fp, labels: labels, created: time.Now().UTC()}
	s.sshKeys[k.id] = k
	writeJSON(w, http.StatusCreated, map[string]any{"ssh_key": s.schemaSSHKeyLocked(k)})
}

func (s *Server) deleteSSHKey(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "ssh_key")
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sshKeys[id]; !ok {
		notFound(w, "ssh_key", r.PathValue("id"))
		return
	}
	delete(s.sshKeys, id)
	w.WriteHeader(http.StatusNoContent)
}

func schemaNetwork(n *network, servers []int64) schema.Network {
	return schema.Network{
		ID: n.id, Name: n.name, Created: n.created, IPRange: n.ipRange,
		Subnets: []schema.NetworkSubnet{{Type: "cloud", IPRange: n.ipRange, NetworkZone: "eu-central"}},
		Routes:  []schema.NetworkRoute{}, Servers: servers, LoadBalancers: []int64{}, Labels: map[string]string{},
	}
}

func (s *Server) networkServersLocked(id int64) []int64 {
	out := []int64{}
	for _, srv := range s.sortedServersLocked() {
		if contains64(srv.networks, id) {
			out = append(out, srv.id)
		}
	}
	return out
}

func contains64(list []int64, v int64) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (s *Server) listNetworks(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	nets := make([]*network, 0, len(s.networks))
	for _, n := range s.networks {
		nets = append(nets, n)
	}
	sortByID(nets, func(n *network) int64 { return n.id })
	out := make([]schema.Network, 0, len(nets))
	for _, n := range byName(r, nets, func(n *network) string { return n.name }) {
		out = append(out, schemaNetwork(n, s.networkServersLocked(n.id)))
	}
	s.mu.Unlock()
	page, m, ok := pageOf(w, r, out, s.PageSize())
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"networks": append([]schema.Network{}, page...), "meta": m})
}

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	id, ok := pathID(w, r, "id", "network")
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.networks[id]
	if !ok {
		notFound(w, "network", r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"network": schemaNetwork(n, s.networkServersLocked(id))})
}

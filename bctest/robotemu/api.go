package robotemu

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// resetTypes are the reset types every emulated server supports: its
// power button (power, power_long) among them.
var resetTypes = []string{"sw", "hw", "man", "power", "power_long"}

func (e *Emulator) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /server", e.listServers)
	mux.HandleFunc("GET /server/{number}", e.getServer)
	mux.HandleFunc("POST /server/{number}", e.nameServer)
	mux.HandleFunc("GET /boot/{number}/rescue", e.getRescue)
	mux.HandleFunc("POST /boot/{number}/rescue", e.activateRescue)
	mux.HandleFunc("DELETE /boot/{number}/rescue", e.deactivateRescue)
	mux.HandleFunc("GET /reset", e.listResets)
	mux.HandleFunc("GET /reset/{number}", e.getReset)
	mux.HandleFunc("POST /reset/{number}", e.reset)
	mux.HandleFunc("GET /key", e.listKeys)
	mux.HandleFunc("POST /key", e.addKey)
	mux.HandleFunc("GET /order/server/product", e.listProducts)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		e.mu.Lock()
		e.requests = append(e.requests, Request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body)})
		var fail *failure
		if len(e.fail) > 0 {
			fail = &e.fail[0]
			e.fail = e.fail[1:]
		}
		limited := e.rateLimit > 0
		if limited {
			e.rateLimit--
		}
		e.mu.Unlock()
		if fail != nil {
			writeError(w, fail.status, codeOfStatus(fail.status), fail.body)
			return
		}
		if limited {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": map[string]any{
				"status": 403, "code": "RATE_LIMIT_EXCEEDED", "max_request": 200, "interval": 3600,
				"message": "rate limit exceeded",
			}})
			return
		}
		user, pass, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(user), []byte(e.opts.User)) != 1 ||
			subtle.ConstantTimeCompare([]byte(pass), []byte(e.opts.Password)) != 1 {
			writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "Unauthorized")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func codeOfStatus(status int) string {
	switch status {
	case 400, 422:
		return "INVALID_INPUT"
	case 401:
		return "UNAUTHORIZED"
	case 403:
		return "FORBIDDEN"
	case 404:
		return "NOT_FOUND"
	case 409:
		return "CONFLICT"
	case 503:
		return "MAINTENANCE"
	}
	return "INTERNAL_ERROR"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"status": status, "code": code, "message": message}})
}

func invalidInput(w http.ResponseWriter, invalid ...string) {
	writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
		"status": 400, "code": "INVALID_INPUT", "message": "invalid input", "missing": nil, "invalid": invalid,
	}})
}

// serverOf finds the path's server, answering SERVER_NOT_FOUND itself;
// it returns with e.mu held when it found one.
func (e *Emulator) serverOf(w http.ResponseWriter, r *http.Request) *server {
	n, err := strconv.Atoi(r.PathValue("number"))
	e.mu.Lock()
	var s *server
	if err == nil {
		s = e.serverLocked(n)
	}
	if s == nil {
		e.mu.Unlock()
		writeError(w, http.StatusNotFound, "SERVER_NOT_FOUND", "Server not found")
		return nil
	}
	return s
}

func (s *server) jsonLocked(detail bool) map[string]any {
	m := map[string]any{
		"server_ip": s.ip, "server_ipv6_net": s.ipv6, "server_number": s.number,
		"server_name": s.name, "product": s.product, "dc": s.dc, "traffic": "unlimited",
		"status": "ready", "cancelled": false, "paid_until": "2027-01-31",
		"ip": []string{s.ip}, "subnet": []map[string]string{{"ip": s.ipv6, "mask": "64"}},
	}
	if detail {
		m["reset"], m["rescue"], m["vnc"], m["windows"], m["plesk"], m["cpanel"], m["wol"], m["hot_swap"] =
			true, true, true, false, false, false, true, false
		m["linked_storagebox"] = nil
	}
	return m
}

func (e *Emulator) listServers(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	out := make([]map[string]any, 0, len(e.servers))
	for _, s := range e.servers {
		out = append(out, map[string]any{"server": s.jsonLocked(false)})
	}
	e.mu.Unlock()
	if len(out) == 0 {
		// Robot answers an account without servers so.
		writeError(w, http.StatusNotFound, "SERVER_NOT_FOUND", "No server found")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Emulator) getServer(w http.ResponseWriter, r *http.Request) {
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	v := s.jsonLocked(true)
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"server": v})
}

func (e *Emulator) nameServer(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		invalidInput(w)
		return
	}
	name, ok := r.PostForm["server_name"]
	if !ok || len(name) != 1 || strings.ContainsAny(name[0], "\x00\r\n") || len(name[0]) > 100 {
		invalidInput(w, "server_name")
		return
	}
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	claim := s.name == "" && name[0] != ""
	s.name = name[0]
	lose := claim && e.loseCreate
	if lose {
		e.loseCreate = false
	}
	if claim && e.stealClaim {
		e.stealClaim = false
		s.name = "claimed-elsewhere"
	}
	v := s.jsonLocked(true)
	e.mu.Unlock()
	if lose {
		hijackAndClose(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"server": v})
}

// hijackAndClose closes the connection before a byte of the answer.
func hijackAndClose(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("robotemu: the connection cannot be hijacked")
	}
	conn, _, err := hj.Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

func (e *Emulator) rescueJSONLocked(s *server) map[string]any {
	m := map[string]any{
		"server_ip": s.ip, "server_ipv6_net": s.ipv6, "server_number": s.number,
		"os": []string{"linux", "vkvm"}, "active": false, "password": nil,
		"authorized_key": []any{}, "host_key": []any{}, "boot_time": nil,
	}
	if s.rescue != nil {
		keys := []any{}
		for _, fp := range s.rescue.keys {
			for _, k := range e.keys {
				if k.fingerprint == fp {
					keys = append(keys, map[string]any{"key": map[string]any{
						"name": k.name, "fingerprint": k.fingerprint, "type": k.typ, "size": k.size,
					}})
				}
			}
		}
		m["os"], m["active"], m["password"], m["authorized_key"] = "linux", true, s.rescue.password, keys
		m["host_key"] = []any{map[string]any{"key": map[string]any{
			"fingerprint": ssh.FingerprintLegacyMD5(e.hostKey), "type": "ED25519", "size": 256,
		}}}
	}
	return m
}

func (e *Emulator) getRescue(w http.ResponseWriter, r *http.Request) {
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	v := e.rescueJSONLocked(s)
	if s.rescue != nil {
		// Robot shows a rescue's password only in the activation's answer.
		v["password"] = nil
	}
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"rescue": v})
}

func (e *Emulator) activateRescue(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		invalidInput(w)
		return
	}
	osName := r.PostForm.Get("os")
	if osName != "linux" && osName != "vkvm" {
		invalidInput(w, "os")
		return
	}
	keys := append(r.PostForm["authorized_key[]"], r.PostForm["authorized_key"]...)
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	defer e.mu.Unlock()
	if s.rescue != nil {
		writeError(w, http.StatusConflict, "BOOT_ALREADY_ENABLED", "A boot option is already active")
		return
	}
	for _, fp := range keys {
		if !slices.ContainsFunc(e.keys, func(k key) bool { return k.fingerprint == fp }) {
			invalidInput(w, "authorized_key")
			return
		}
	}
	s.rescue = &rescue{password: randomString(12), keys: keys}
	writeJSON(w, http.StatusOK, map[string]any{"rescue": e.rescueJSONLocked(s)})
}

func (e *Emulator) deactivateRescue(w http.ResponseWriter, r *http.Request) {
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	defer e.mu.Unlock()
	s.rescue = nil
	writeJSON(w, http.StatusOK, map[string]any{"rescue": e.rescueJSONLocked(s)})
}

func (s *server) resetJSONLocked() map[string]any {
	status := "shut off"
	if s.on {
		status = "running"
	}
	return map[string]any{
		"server_ip": s.ip, "server_ipv6_net": s.ipv6, "server_number": s.number,
		"type": resetTypes, "operating_status": status,
	}
}

func (e *Emulator) listResets(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	out := make([]map[string]any, 0, len(e.servers))
	for _, s := range e.servers {
		out = append(out, map[string]any{"reset": s.resetJSONLocked()})
	}
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (e *Emulator) getReset(w http.ResponseWriter, r *http.Request) {
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	v := s.resetJSONLocked()
	e.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"reset": v})
}

// reset presses the server's buttons: sw is CTRL+ALT+DEL (a running
// system reboots), hw and man cycle the power (the server runs after
// either), power is a short press of the power button (a running system
// shuts down on the ACPI signal, which the emulator does at once; a server
// that is off starts) and power_long a long one (off at once).
func (e *Emulator) reset(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		invalidInput(w)
		return
	}
	typ := r.PostForm.Get("type")
	if !slices.Contains(resetTypes, typ) {
		invalidInput(w, "type")
		return
	}
	s := e.serverOf(w, r)
	if s == nil {
		return
	}
	defer e.mu.Unlock()
	s.resets = append(s.resets, typ)
	switch typ {
	case "sw":
		if s.on {
			s.bootLocked()
		}
	case "hw", "man":
		s.bootLocked()
	case "power":
		if s.on {
			s.powerOffLocked()
		} else {
			s.bootLocked()
		}
	case "power_long":
		s.powerOffLocked()
	}
	writeJSON(w, http.StatusOK, map[string]any{"reset": map[string]any{"server_ip": s.ip, "server_ipv6_net": s.ipv6, "type": typ}})
}

func (k key) json() map[string]any {
	return map[string]any{"key": map[string]any{
		"name": k.name, "fingerprint": k.fingerprint, "type": k.typ, "size": k.size, "data": k.data,
		"created_at": time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Format(time.DateTime),
	}}
}

func (e *Emulator) listKeys(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	out := make([]map[string]any, 0, len(e.keys))
	for _, k := range e.keys {
		out = append(out, k.json())
	}
	e.mu.Unlock()
	if len(out) == 0 {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "No keys found")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (e *Emulator) addKey(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		invalidInput(w)
		return
	}
	name, data := r.PostForm.Get("name"), r.PostForm.Get("data")
	pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(data))
	if name == "" || err != nil {
		invalidInput(w, "name", "data")
		return
	}
	k := key{name: name, fingerprint: ssh.FingerprintLegacyMD5(pub), data: strings.TrimSpace(data)}
	k.typ, k.size = keyTypeSize(pub)
	e.mu.Lock()
	defer e.mu.Unlock()
	if slices.ContainsFunc(e.keys, func(o key) bool { return o.fingerprint == k.fingerprint }) {
		writeError(w, http.StatusConflict, "KEY_ALREADY_EXISTS", "The key already exists")
		return
	}
	e.keys = append(e.keys, k)
	writeJSON(w, http.StatusCreated, k.json())
}

func keyTypeSize(pub ssh.PublicKey) (string, int) {
	switch pub.Type() {
	case ssh.KeyAlgoED25519:
		return "ED25519", 256
	case ssh.KeyAlgoRSA:
		return "RSA", 4096
	}
	return strings.ToUpper(strings.TrimPrefix(pub.Type(), "ssh-")), 0
}

func (e *Emulator) listProducts(w http.ResponseWriter, r *http.Request) {
	out := make([]map[string]any, 0, len(catalog))
	for _, p := range catalog {
		prices := []map[string]any{}
		locs := []string{}
		for _, pr := range p.prices {
			locs = append(locs, pr.location)
			prices = append(prices, map[string]any{
				"location":    pr.location,
				"price":       map[string]string{"net": pr.net, "gross": pr.gross},
				"price_setup": map[string]string{"net": pr.setup, "gross": pr.setup},
			})
		}
		out = append(out, map[string]any{"product": map[string]any{
			"id": p.id, "name": p.name, "description": p.description, "traffic": "unlimited",
			"dist": e.opts.Images, "lang": []string{"en"}, "location": locs, "prices": prices,
			"orderable_addons": []any{},
		}})
	}
	writeJSON(w, http.StatusOK, out)
}

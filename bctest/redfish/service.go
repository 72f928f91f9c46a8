// Package redfish is a Redfish BMC for tests and `dev`: an HTTP service that
// follows the DMTF Redfish schema for one computer system (ServiceRoot,
// Systems, ComputerSystem with PowerState, Boot override and the
// ComputerSystem.Reset action, a Manager with a virtual CD, and the
// SessionService with X-Auth-Token sessions) and drives a machine behind it:
// a QEMU VM over QMP (QEMUPower) or a simulated one (MemoryPower).
//
// It is a fake that speaks the real protocol: gofish and Debian's own
// Redfish clients (redfishtool, python3-sushy) drive it. Nothing in the
// control plane or the agent may import it; `dev --sim-machines` may, to
// give its simulated machines a BMC.
package redfish

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config sets up a Service.
type Config struct {
	// Username and Password are the one account the BMC knows.
	Username, Password string
	// Power is the machine (default: a new MemoryPower).
	Power Power
	// SessionTimeout ends a session unused this long (default 30 min).
	SessionTimeout time.Duration
	// Now is the clock for session expiry (default time.Now).
	Now func() time.Time
	// Logger gets one debug line per request (never a credential).
	Logger *slog.Logger
	// ResetTypes are the ComputerSystem.Reset types offered (default: On,
	// ForceOff, GracefulShutdown, ForceRestart, PowerCycle); a subset plays
	// a BMC that lacks some.
	ResetTypes []string
	// NoVirtualMedia plays a BMC without a virtual CD.
	NoVirtualMedia bool
}

// Service is the emulated BMC: an http.Handler.
type Service struct {
	cfg Config

	mu        sync.Mutex
	sessions  map[string]*session // by id
	nextID    int
	version   int // the system's ETag: bumped on every change
	bootTgt   string
	bootOn    string // BootSourceOverrideEnabled
	bootMode  string
	media     virtualMedia
	powerBusy sync.Mutex // one power change at a time
}

type session struct {
	id, token, user string
	created, used   time.Time
}

type virtualMedia struct {
	image    string
	inserted bool
}

const (
	root        = "/redfish/v1"
	systemPath  = root + "/Systems/1"
	resetPath   = systemPath + "/Actions/ComputerSystem.Reset"
	managerPath = root + "/Managers/BMC"
	mediaPath   = managerPath + "/VirtualMedia/CD1"
	insertPath  = mediaPath + "/Actions/VirtualMedia.InsertMedia"
	ejectPath   = mediaPath + "/Actions/VirtualMedia.EjectMedia"
	sessionsURI = root + "/SessionService/Sessions"
	uuid        = "8b6a1f1e-2c4d-4e5f-9a0b-1c2d3e4f5a6b"
)

var (
	allResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"}
	bootTargets   = []string{"None", "Pxe", "Hdd", "Cd", "BiosSetup"}
	bootEnabled   = []string{"Disabled", "Once", "Continuous"}
	bootModes     = []string{"Legacy", "UEFI"}
)

// New returns a Service for cfg.
func New(cfg Config) *Service {
	if cfg.Power == nil {
		cfg.Power = &MemoryPower{}
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ResetTypes == nil {
		cfg.ResetTypes = allResetTypes
	}
	for _, rt := range cfg.ResetTypes {
		if !slices.Contains(allResetTypes, rt) {
			panic(fmt.Sprintf("redfish: reset type %q is not one of %v", rt, allResetTypes))
		}
	}
	return &Service{cfg: cfg, sessions: map[string]*session{}, bootTgt: "None", bootOn: "Disabled", bootMode: "Legacy"}
}

// BootOverride is the system's BootSourceOverrideTarget and
// BootSourceOverrideEnabled.
func (s *Service) BootOverride() (target, enabled string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootTgt, s.bootOn
}

// Media is the virtual CD's image and whether it is inserted.
func (s *Service) Media() (image string, inserted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.media.image, s.media.inserted
}

// Sessions counts the open sessions.
func (s *Service) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	return len(s.sessions)
}

func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	w = rec
	w.Header().Set("OData-Version", "4.0")
	w.Header().Set("Cache-Control", "no-cache")
	path := strings.TrimSuffix(r.URL.Path, "/")
	user, authed := s.authenticate(r)
	defer func() {
		s.cfg.Logger.Debug("redfish request", "method", r.Method, "path", r.URL.Path, "user", user, "status", rec.status)
	}()

	// The service root, the version object and login need no credentials
	// (Redfish spec §13.3.4); everything else does.
	public := path == "/redfish" || path == root || path == root+"/odata" ||
		(path == sessionsURI && r.Method == http.MethodPost)
	if !public && !authed {
		w.Header().Set("WWW-Authenticate", `Basic realm="bctest redfish"`)
		writeError(w, http.StatusUnauthorized, "NoValidSession", "There is no valid session established with the implementation.")
		return
	}

	switch {
	case path == "/redfish":
		s.get(w, r, map[string]any{"v1": root + "/"})
	case path == root:
		s.get(w, r, serviceRoot())
	case path == root+"/odata":
		s.get(w, r, odata())
	case path == root+"/Systems":
		s.get(w, r, collection(root+"/Systems", "#ComputerSystemCollection.ComputerSystemCollection", "Computer System Collection", systemPath))
	case path == systemPath:
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.getSystem(w, r)
		case http.MethodPatch:
			s.patchSystem(w, r)
		default:
			notAllowed(w, "GET, HEAD, PATCH")
		}
	case path == resetPath:
		if r.Method != http.MethodPost {
			notAllowed(w, "POST")
			return
		}
		s.reset(w, r)
	case path == root+"/Managers":
		s.get(w, r, collection(root+"/Managers", "#ManagerCollection.ManagerCollection", "Manager Collection", managerPath))
	case path == managerPath:
		s.get(w, r, s.manager())
	case strings.HasPrefix(path, managerPath+"/VirtualMedia") && s.cfg.NoVirtualMedia:
		writeError(w, http.StatusNotFound, "ResourceMissingAtURI", fmt.Sprintf("The resource at the URI %s was not found.", r.URL.Path))
	case path == managerPath+"/VirtualMedia":
		s.get(w, r, collection(managerPath+"/VirtualMedia", "#VirtualMediaCollection.VirtualMediaCollection", "Virtual Media Collection", mediaPath))
	case path == mediaPath:
		s.get(w, r, s.mediaResource())
	case path == insertPath || path == ejectPath:
		if r.Method != http.MethodPost {
			notAllowed(w, "POST")
			return
		}
		s.mediaAction(w, r, path == insertPath)
	case path == root+"/SessionService":
		s.get(w, r, s.sessionService())
	case path == sessionsURI:
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			s.get(w, r, s.sessionCollection())
		case http.MethodPost:
			s.login(w, r)
		default:
			notAllowed(w, "GET, HEAD, POST")
		}
	case strings.HasPrefix(path, sessionsURI+"/"):
		s.sessionItem(w, r, strings.TrimPrefix(path, sessionsURI+"/"))
	default:
		writeError(w, http.StatusNotFound, "ResourceMissingAtURI", fmt.Sprintf("The resource at the URI %s was not found.", r.URL.Path))
	}
}

// authenticate accepts a live session token or Basic credentials.
func (s *Service) authenticate(r *http.Request) (string, bool) {
	if token := r.Header.Get("X-Auth-Token"); token != "" {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.expireLocked()
		for _, sess := range s.sessions {
			if subtle.ConstantTimeCompare([]byte(sess.token), []byte(token)) == 1 {
				sess.used = s.cfg.Now()
				return sess.user, true
			}
		}
		return "", false
	}
	if user, pass, ok := r.BasicAuth(); ok {
		return user, s.credentialsMatch(user, pass)
	}
	return "", false
}

func (s *Service) credentialsMatch(user, pass string) bool {
	u := subtle.ConstantTimeCompare([]byte(user), []byte(s.cfg.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(s.cfg.Password))
	return u&p == 1
}

func (s *Service) expireLocked() {
	now := s.cfg.Now()
	for id, sess := range s.sessions {
		if now.Sub(sess.used) > s.cfg.SessionTimeout {
			delete(s.sessions, id)
		}
	}
}

// get serves a read-only resource.
func (s *Service) get(w http.ResponseWriter, r *http.Request, body any) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		notAllowed(w, "GET, HEAD")
		return
	}
	writeJSON(w, http.StatusOK, body)
}

func serviceRoot() map[string]any {
	return map[string]any{
		"@odata.type":    "#ServiceRoot.v1_15_0.ServiceRoot",
		"@odata.id":      root,
		"Id":             "RootService",
		"Name":           "Root Service",
		"RedfishVersion": "1.15.0",
		"UUID":           uuid,
		"Vendor":         "Better Compute",
		"Product":        "bctest Redfish emulator",
		"ProtocolFeaturesSupported": map[string]any{
			"ExpandQuery":     map[string]any{"ExpandAll": false, "Levels": false, "Links": false, "NoLinks": false},
			"FilterQuery":     false,
			"SelectQuery":     false,
			"OnlyMemberQuery": false,
			"ExcerptQuery":    false,
		},
		"Systems":        link(root + "/Systems"),
		"Managers":       link(root + "/Managers"),
		"SessionService": link(root + "/SessionService"),
		"Links":          map[string]any{"Sessions": link(sessionsURI)},
	}
}

func odata() map[string]any {
	svc := func(name, url string) map[string]any {
		return map[string]any{"name": name, "kind": "Singleton", "url": url}
	}
	return map[string]any{
		"@odata.context": root + "/$metadata",
		"value": []any{
			svc("Service", root), svc("Systems", root+"/Systems"), svc("Managers", root+"/Managers"),
			svc("SessionService", root+"/SessionService"), svc("Sessions", sessionsURI),
		},
	}
}

func link(id string) map[string]string { return map[string]string{"@odata.id": id} }

func collection(id, typ, name string, members ...string) map[string]any {
	links := make([]map[string]string, 0, len(members))
	for _, m := range members {
		links = append(links, link(m))
	}
	return map[string]any{
		"@odata.id": id, "@odata.type": typ, "Name": name,
		"Members@odata.count": len(links), "Members": links,
	}
}

func (s *Service) etagLocked() string { return `W/"` + strconv.Itoa(s.version) + `"` }

func (s *Service) getSystem(w http.ResponseWriter, r *http.Request) {
	on, err := s.cfg.Power.IsOn(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", "The power state could not be read: "+err.Error())
		return
	}
	s.mu.Lock()
	body, etag := s.systemLocked(on), s.etagLocked()
	s.mu.Unlock()
	w.Header().Set("ETag", etag)
	writeJSON(w, http.StatusOK, body)
}

func (s *Service) systemLocked(on bool) map[string]any {
	power := "Off"
	if on {
		power = "On"
	}
	return map[string]any{
		"@odata.type":  "#ComputerSystem.v1_20_0.ComputerSystem",
		"@odata.id":    systemPath,
		"@odata.etag":  s.etagLocked(),
		"Id":           "1",
		"Name":         "bctest machine",
		"SystemType":   "Physical",
		"Manufacturer": "Better Compute",
		"Model":        "bctest Redfish emulator",
		"UUID":         uuid,
		"PowerState":   power,
		"Status":       map[string]string{"State": "Enabled", "Health": "OK"},
		"Boot": map[string]any{
			"BootSourceOverrideTarget":                          s.bootTgt,
			"BootSourceOverrideTarget@Redfish.AllowableValues":  bootTargets,
			"BootSourceOverrideEnabled":                         s.bootOn,
			"BootSourceOverrideEnabled@Redfish.AllowableValues": bootEnabled,
			"BootSourceOverrideMode":                            s.bootMode,
			"BootSourceOverrideMode@Redfish.AllowableValues":    bootModes,
		},
		"Actions": map[string]any{
			"#ComputerSystem.Reset": map[string]any{
				"target":                            resetPath,
				"ResetType@Redfish.AllowableValues": s.cfg.ResetTypes,
			},
		},
		"Links": map[string]any{"ManagedBy": []any{link(managerPath)}},
	}
}

// patchSystem applies a Boot change, all of it or nothing.
func (s *Service) patchSystem(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedJSON", "The request body submitted was malformed JSON: "+err.Error())
		return
	}
	// Read the power first: the machine may be busy starting, and the
	// service's lock must not wait on it.
	on, err := s.cfg.Power.IsOn(r.Context())
	if err != nil {
		writeError(w, http.StatusInternalServerError, "InternalError", "The power state could not be read: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := r.Header.Get("If-Match"); m != "" && m != "*" && m != s.etagLocked() && "W/"+m != s.etagLocked() {
		writeError(w, http.StatusPreconditionFailed, "PreconditionFailed", "The ETag supplied did not match the ETag required to change this resource.")
		return
	}
	tgt, enabled, mode := s.bootTgt, s.bootOn, s.bootMode
	for key, raw := range body {
		if strings.HasPrefix(key, "@") {
			continue
		}
		if key != "Boot" {
			if _, known := s.systemLocked(false)[key]; known {
				writeError(w, http.StatusBadRequest, "PropertyNotWritable", fmt.Sprintf("The property %s is a read only property and cannot be assigned a value.", key), "#/"+key)
			} else {
				writeError(w, http.StatusBadRequest, "PropertyUnknown", fmt.Sprintf("The property %s is not in the list of valid properties for the resource.", key), "#/"+key)
			}
			return
		}
		var boot map[string]any
		if err := json.Unmarshal(raw, &boot); err != nil {
			writeError(w, http.StatusBadRequest, "PropertyValueTypeError", "The value for the property Boot is of a different type than the property can accept.", "#/Boot")
			return
		}
		for bk, bv := range boot {
			allowed := map[string][]string{
				"BootSourceOverrideTarget":  bootTargets,
				"BootSourceOverrideEnabled": bootEnabled,
				"BootSourceOverrideMode":    bootModes,
			}[bk]
			if allowed == nil {
				writeError(w, http.StatusBadRequest, "PropertyUnknown", fmt.Sprintf("The property %s is not in the list of valid properties for Boot.", bk), "#/Boot/"+bk)
				return
			}
			v, ok := bv.(string)
			if !ok || !slices.Contains(allowed, v) {
				writeError(w, http.StatusBadRequest, "PropertyValueNotInList", fmt.Sprintf("The value %v for the property %s is not in the list of acceptable values %v.", bv, bk, allowed), "#/Boot/"+bk)
				return
			}
			switch bk {
			case "BootSourceOverrideTarget":
				tgt = v
			case "BootSourceOverrideEnabled":
				enabled = v
			case "BootSourceOverrideMode":
				mode = v
			}
		}
	}
	s.bootTgt, s.bootOn, s.bootMode = tgt, enabled, mode
	s.version++
	w.Header().Set("ETag", s.etagLocked())
	writeJSON(w, http.StatusOK, s.systemLocked(on))
}

// bootDevice is the device this boot uses; a Once override is spent by it.
func (s *Service) bootDevice() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bootOn == "Disabled" || s.bootTgt == "None" {
		return ""
	}
	tgt := s.bootTgt
	if s.bootOn == "Once" {
		s.bootOn = "Disabled"
		s.version++
	}
	return tgt
}

func (s *Service) reset(w http.ResponseWriter, r *http.Request) {
	var body struct {
		ResetType *string `json:"ResetType"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedJSON", "The request body submitted was malformed JSON: "+err.Error())
		return
	}
	if body.ResetType == nil {
		writeError(w, http.StatusBadRequest, "ActionParameterMissing", "The action ComputerSystem.Reset requires the parameter ResetType to be present in the request body.", "#/ResetType")
		return
	}
	rt := *body.ResetType
	if !slices.Contains(s.cfg.ResetTypes, rt) {
		writeError(w, http.StatusBadRequest, "ActionParameterNotSupported", fmt.Sprintf("The parameter ResetType value %s is not supported by the action ComputerSystem.Reset (allowed: %v).", rt, s.cfg.ResetTypes), "#/ResetType")
		return
	}
	s.powerBusy.Lock()
	defer s.powerBusy.Unlock()
	ctx := r.Context()
	on, err := s.cfg.Power.IsOn(ctx)
	if err == nil {
		err = s.applyReset(ctx, rt, on)
	}
	if err != nil {
		var c conflict
		if errors.As(err, &c) {
			writeError(w, http.StatusConflict, "ResourceInStandby", string(c))
			return
		}
		writeError(w, http.StatusInternalServerError, "InternalError", fmt.Sprintf("ComputerSystem.Reset %s failed: %v", rt, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// conflict is a reset the system's state does not allow.
type conflict string

func (c conflict) Error() string { return string(c) }

func (s *Service) applyReset(ctx context.Context, rt string, on bool) error {
	switch rt {
	case "On":
		if on {
			return nil
		}
		return s.cfg.Power.On(ctx, s.bootDevice())
	case "ForceOff":
		if !on {
			return nil
		}
		return s.cfg.Power.Off(ctx, false)
	case "GracefulShutdown":
		if !on {
			return nil
		}
		return s.cfg.Power.Off(ctx, true)
	case "ForceRestart":
		if !on {
			return conflict("The system is off; ForceRestart needs it on (use On).")
		}
		return s.cfg.Power.Restart(ctx, s.bootDevice(), false)
	case "PowerCycle":
		if !on {
			return s.cfg.Power.On(ctx, s.bootDevice())
		}
		return s.cfg.Power.Restart(ctx, s.bootDevice(), true)
	}
	return fmt.Errorf("reset type %s has no handler", rt)
}

func (s *Service) manager() map[string]any {
	m := map[string]any{
		"@odata.type":     "#Manager.v1_19_0.Manager",
		"@odata.id":       managerPath,
		"Id":              "BMC",
		"Name":            "bctest BMC",
		"ManagerType":     "BMC",
		"FirmwareVersion": "1.0.0",
		"Status":          map[string]string{"State": "Enabled", "Health": "OK"},
		"Links":           map[string]any{"ManagerForServers": []any{link(systemPath)}},
	}
	if !s.cfg.NoVirtualMedia {
		m["VirtualMedia"] = link(managerPath + "/VirtualMedia")
	}
	return m
}

func (s *Service) mediaResource() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var image any
	connected := "NotConnected"
	if s.media.image != "" {
		image, connected = s.media.image, "URI"
	}
	return map[string]any{
		"@odata.type":    "#VirtualMedia.v1_6_0.VirtualMedia",
		"@odata.id":      mediaPath,
		"Id":             "CD1",
		"Name":           "Virtual CD",
		"MediaTypes":     []string{"CD", "DVD"},
		"Image":          image,
		"Inserted":       s.media.inserted,
		"WriteProtected": true,
		"ConnectedVia":   connected,
		"Actions": map[string]any{
			"#VirtualMedia.InsertMedia": map[string]string{"target": insertPath},
			"#VirtualMedia.EjectMedia":  map[string]string{"target": ejectPath},
		},
	}
}

func (s *Service) mediaAction(w http.ResponseWriter, r *http.Request, insert bool) {
	var body struct {
		Image    *string `json:"Image"`
		Inserted *bool   `json:"Inserted"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedJSON", "The request body submitted was malformed JSON: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !insert {
		s.media = virtualMedia{}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if body.Image == nil {
		writeError(w, http.StatusBadRequest, "ActionParameterMissing", "The action VirtualMedia.InsertMedia requires the parameter Image to be present in the request body.", "#/Image")
		return
	}
	if u, err := url.Parse(*body.Image); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		writeError(w, http.StatusBadRequest, "ActionParameterValueFormatError", fmt.Sprintf("The value %q for the parameter Image in the action VirtualMedia.InsertMedia is not an http or https URL.", *body.Image), "#/Image")
		return
	}
	if s.media.image != "" {
		writeError(w, http.StatusConflict, "ResourceInUse", "Media is already inserted; eject it first.", "#/Image")
		return
	}
	inserted := body.Inserted == nil || *body.Inserted
	s.media = virtualMedia{image: *body.Image, inserted: inserted}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) sessionService() map[string]any {
	return map[string]any{
		"@odata.type":    "#SessionService.v1_1_9.SessionService",
		"@odata.id":      root + "/SessionService",
		"Id":             "SessionService",
		"Name":           "Session Service",
		"ServiceEnabled": true,
		"SessionTimeout": int(s.cfg.SessionTimeout / time.Second),
		"Status":         map[string]string{"State": "Enabled", "Health": "OK"},
		"Sessions":       link(sessionsURI),
	}
}

func (s *Service) sessionCollection() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	ids := make([]string, 0, len(s.sessions))
	for id := range s.sessions {
		ids = append(ids, sessionsURI+"/"+id)
	}
	slices.Sort(ids)
	return collection(sessionsURI, "#SessionCollection.SessionCollection", "Session Collection", ids...)
}

func sessionResource(sess *session) map[string]any {
	return map[string]any{
		"@odata.type": "#Session.v1_5_0.Session",
		"@odata.id":   sessionsURI + "/" + sess.id,
		"Id":          sess.id,
		"Name":        "User Session",
		"UserName":    sess.user,
		"CreatedTime": sess.created.UTC().Format(time.RFC3339),
	}
}

// login creates a session: 201, X-Auth-Token and Location headers.
func (s *Service) login(w http.ResponseWriter, r *http.Request) {
	var body struct {
		UserName *string `json:"UserName"`
		Password *string `json:"Password"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "MalformedJSON", "The request body submitted was malformed JSON: "+err.Error())
		return
	}
	if body.UserName == nil || body.Password == nil {
		writeError(w, http.StatusBadRequest, "PropertyMissing", "The properties UserName and Password are required to create a session.", "#/UserName", "#/Password")
		return
	}
	if !s.credentialsMatch(*body.UserName, *body.Password) {
		writeError(w, http.StatusUnauthorized, "ResourceAtURIUnauthorized", "While accessing the resource at "+sessionsURI+", the service received an authorization error: the user name or password is wrong.")
		return
	}
	token := make([]byte, 24)
	_, _ = rand.Read(token)
	s.mu.Lock()
	s.nextID++
	now := s.cfg.Now()
	sess := &session{id: strconv.Itoa(s.nextID), token: hex.EncodeToString(token), user: *body.UserName, created: now, used: now}
	s.sessions[sess.id] = sess
	s.mu.Unlock()
	w.Header().Set("X-Auth-Token", sess.token)
	w.Header().Set("Location", sessionsURI+"/"+sess.id)
	writeJSON(w, http.StatusCreated, sessionResource(sess))
}

func (s *Service) sessionItem(w http.ResponseWriter, r *http.Request, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	sess, ok := s.sessions[id]
	if !ok {
		writeError(w, http.StatusNotFound, "ResourceMissingAtURI", fmt.Sprintf("The resource at the URI %s was not found.", r.URL.Path))
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		writeJSON(w, http.StatusOK, sessionResource(sess))
	case http.MethodDelete:
		delete(s.sessions, id)
		w.WriteHeader(http.StatusNoContent)
	default:
		notAllowed(w, "GET, HEAD, DELETE")
	}
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json;charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func notAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "The HTTP method is not allowed on this resource (allowed: "+allow+").")
}

// writeError answers with the Redfish error body: a general error whose
// extended info names the Base registry message and the properties at fault.
func writeError(w http.ResponseWriter, status int, messageID, message string, related ...string) {
	info := map[string]any{
		"@odata.type":     "#Message.v1_1_1.Message",
		"MessageId":       "Base.1.8." + messageID,
		"Message":         message,
		"Severity":        "Critical",
		"MessageSeverity": "Critical",
		"Resolution":      "Correct the request and resubmit it.",
	}
	if len(related) > 0 {
		info["RelatedProperties"] = related
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code":                  "Base.1.0.GeneralError",
		"message":               "A general error has occurred. See ExtendedInfo for more information.",
		"@Message.ExtendedInfo": []any{info},
	}})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(status int) {
	r.status = status
	r.ResponseWriter.WriteHeader(status)
}

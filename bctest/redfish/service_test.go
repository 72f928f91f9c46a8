package redfish_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/better-compute/better-compute/bctest"
	"github.com/better-compute/better-compute/bctest/redfish"
)

type fixture struct {
	svc   *redfish.Service
	power *redfish.MemoryPower
	srv   *httptest.Server
	clock *bctest.SimClock
}

func setup(t *testing.T) fixture {
	t.Helper()
	power := &redfish.MemoryPower{}
	clock := bctest.NewSimClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	svc := redfish.New(redfish.Config{Username: "admin", Password: "pw-7f3a", Power: power, Now: clock.Now, SessionTimeout: time.Hour})
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	return fixture{svc: svc, power: power, srv: srv, clock: clock}
}

// reply is what a test reads of a response; do has closed its body.
type reply struct {
	StatusCode int
	Header     http.Header
}

// do sends a request with Basic credentials (unless user is "") and decodes
// a JSON body, if any.
func (f fixture) do(t *testing.T, method, path, body, user string, hdr map[string]string) (reply, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.srv.URL+path, rd)
	require.NoError(t, err)
	if user != "" {
		req.SetBasicAuth(user, "pw-7f3a")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(raw) > 0 {
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	}
	return reply{StatusCode: resp.StatusCode, Header: resp.Header}, out
}

// requireError checks the Redfish error body: a general error whose
// extended info names the Base registry message.
func requireError(t *testing.T, body map[string]any, messageID string) {
	t.Helper()
	e, ok := body["error"].(map[string]any)
	require.True(t, ok, "error body: %v", body)
	require.Equal(t, "Base.1.0.GeneralError", e["code"])
	require.NotEmpty(t, e["message"])
	info := e["@Message.ExtendedInfo"].([]any)[0].(map[string]any)
	require.Equal(t, "Base.1.8."+messageID, info["MessageId"])
	require.NotEmpty(t, info["Message"])
}

func TestServiceRootIsPublicAndFollowsTheSchema(t *testing.T) {
	t.Parallel()
	f := setup(t)
	resp, root := f.do(t, "GET", "/redfish/v1/", "", "", nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "4.0", resp.Header.Get("OData-Version"))
	require.Equal(t, "/redfish/v1", root["@odata.id"])
	require.Equal(t, "#ServiceRoot.v1_15_0.ServiceRoot", root["@odata.type"])
	require.Equal(t, "RootService", root["Id"])
	require.NotEmpty(t, root["Name"])
	require.NotEmpty(t, root["RedfishVersion"])
	require.Equal(t, map[string]any{"@odata.id": "/redfish/v1/Systems"}, root["Systems"])
	require.Equal(t, map[string]any{"@odata.id": "/redfish/v1/Managers"}, root["Managers"])
	require.Equal(t, map[string]any{"@odata.id": "/redfish/v1/SessionService"}, root["SessionService"])
	require.Equal(t, map[string]any{"Sessions": map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions"}}, root["Links"])

	_, versions := f.do(t, "GET", "/redfish", "", "", nil)
	require.Equal(t, "/redfish/v1/", versions["v1"])
}

func TestEverythingElseNeedsCredentials(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, path := range []string{"/redfish/v1/Systems", "/redfish/v1/Systems/1", "/redfish/v1/Managers/BMC", "/redfish/v1/SessionService/Sessions"} {
		resp, body := f.do(t, "GET", path, "", "", nil)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, path)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic")
		requireError(t, body, "NoValidSession")
	}
	// A wrong password is refused the same way.
	req, _ := http.NewRequest("GET", f.srv.URL+"/redfish/v1/Systems", nil)
	req.SetBasicAuth("admin", "wrong")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	// A reset without credentials changes nothing.
	rep, _ := f.do(t, "POST", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", `{"ResetType":"On"}`, "", nil)
	require.Equal(t, http.StatusUnauthorized, rep.StatusCode)
	require.Empty(t, f.power.Boots())
}

func TestComputerSystemResetAndBoot(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, coll := f.do(t, "GET", "/redfish/v1/Systems", "", "admin", nil)
	require.EqualValues(t, 1, coll["Members@odata.count"])
	require.Equal(t, []any{map[string]any{"@odata.id": "/redfish/v1/Systems/1"}}, coll["Members"])

	resp, sys := f.do(t, "GET", "/redfish/v1/Systems/1", "", "admin", nil)
	require.Equal(t, "Off", sys["PowerState"])
	require.NotEmpty(t, resp.Header.Get("ETag"))
	require.Equal(t, resp.Header.Get("ETag"), sys["@odata.etag"])
	reset := sys["Actions"].(map[string]any)["#ComputerSystem.Reset"].(map[string]any)
	require.Equal(t, "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset", reset["target"])
	require.Equal(t, []any{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"}, reset["ResetType@Redfish.AllowableValues"])
	boot := sys["Boot"].(map[string]any)
	require.Equal(t, "None", boot["BootSourceOverrideTarget"])
	require.Equal(t, "Disabled", boot["BootSourceOverrideEnabled"])
	require.Contains(t, boot["BootSourceOverrideTarget@Redfish.AllowableValues"], "Pxe")

	// Boot override: PXE once, spent by the next boot.
	resp, _ = f.do(t, "PATCH", "/redfish/v1/Systems/1", `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Once"}}`, "admin",
		map[string]string{"If-Match": resp.Header.Get("ETag")})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = f.do(t, "POST", reset["target"].(string), `{"ResetType":"On"}`, "admin", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	_, sys = f.do(t, "GET", "/redfish/v1/Systems/1", "", "admin", nil)
	require.Equal(t, "On", sys["PowerState"])
	require.Equal(t, "Disabled", sys["Boot"].(map[string]any)["BootSourceOverrideEnabled"])
	resp, _ = f.do(t, "POST", reset["target"].(string), `{"ResetType":"ForceRestart"}`, "admin", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, []string{"Pxe", "None"}, f.power.Boots())

	resp, _ = f.do(t, "POST", reset["target"].(string), `{"ResetType":"ForceOff"}`, "admin", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	_, sys = f.do(t, "GET", "/redfish/v1/Systems/1", "", "admin", nil)
	require.Equal(t, "Off", sys["PowerState"])
}

func TestBadRequestsAreRefusedAndChangeNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const system, reset = "/redfish/v1/Systems/1", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		messageID                string
	}{
		{"unknown boot target", "PATCH", system, `{"Boot":{"BootSourceOverrideTarget":"Floppy9","BootSourceOverrideEnabled":"Once"}}`, nil, 400, "PropertyValueNotInList"},
		{"valid and invalid together", "PATCH", system, `{"Boot":{"BootSourceOverrideTarget":"Pxe","BootSourceOverrideEnabled":"Sometimes"}}`, nil, 400, "PropertyValueNotInList"},
		{"read-only property", "PATCH", system, `{"PowerState":"On"}`, nil, 400, "PropertyNotWritable"},
		{"unknown property", "PATCH", system, `{"Colour":"blue"}`, nil, 400, "PropertyUnknown"},
		{"malformed JSON", "PATCH", system, `{"Boot":`, nil, 400, "MalformedJSON"},
		{"stale ETag", "PATCH", system, `{"Boot":{"BootSourceOverrideTarget":"Pxe"}}`, map[string]string{"If-Match": `W/"999"`}, 412, "PreconditionFailed"},
		{"reset without type", "POST", reset, `{}`, nil, 400, "ActionParameterMissing"},
		{"unknown reset type", "POST", reset, `{"ResetType":"Explode"}`, nil, 400, "ActionParameterNotSupported"},
		{"GET on an action", "GET", reset, "", nil, 405, "OperationNotAllowed"},
		{"unknown resource", "GET", "/redfish/v1/Systems/2", "", nil, 404, "ResourceMissingAtURI"},
		{"restart while off", "POST", reset, `{"ResetType":"ForceRestart"}`, nil, 409, "ResourceInStandby"},
		{"insert without image", "POST", "/redfish/v1/Managers/BMC/VirtualMedia/CD1/Actions/VirtualMedia.InsertMedia", `{}`, nil, 400, "ActionParameterMissing"},
		{"insert a file path", "POST", "/redfish/v1/Managers/BMC/VirtualMedia/CD1/Actions/VirtualMedia.InsertMedia", `{"Image":"/etc/passwd"}`, nil, 400, "ActionParameterValueFormatError"},
	} {
		resp, body := f.do(t, tc.method, tc.path, tc.body, "admin", tc.hdr)
		require.Equal(t, tc.status, resp.StatusCode, tc.name)
		requireError(t, body, tc.messageID)
	}
	target, enabled := f.svc.BootOverride()
	require.Equal(t, "None", target)
	require.Equal(t, "Disabled", enabled)
	image, inserted := f.svc.Media()
	require.Empty(t, image)
	require.False(t, inserted)
	require.Empty(t, f.power.Boots())
}

func TestSessionsLoginUseAndLogout(t *testing.T) {
	t.Parallel()
	f := setup(t)
	resp, _ := f.do(t, "POST", "/redfish/v1/SessionService/Sessions", `{"UserName":"admin","Password":"nope"}`, "", nil)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Empty(t, resp.Header.Get("X-Auth-Token"))

	resp, sess := f.do(t, "POST", "/redfish/v1/SessionService/Sessions", `{"UserName":"admin","Password":"pw-7f3a"}`, "", nil)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	token, location := resp.Header.Get("X-Auth-Token"), resp.Header.Get("Location")
	require.NotEmpty(t, token)
	require.Equal(t, location, sess["@odata.id"])
	require.Equal(t, "admin", sess["UserName"])
	require.NotContains(t, sess, "Password")
	require.Equal(t, 1, f.svc.Sessions())

	auth := map[string]string{"X-Auth-Token": token}
	resp, coll := f.do(t, "GET", "/redfish/v1/SessionService/Sessions", "", "", auth)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, []any{map[string]any{"@odata.id": location}}, coll["Members"])

	// Unused past the timeout, the session is gone.
	f.clock.Advance(2 * time.Hour)
	resp, _ = f.do(t, "GET", "/redfish/v1/Systems", "", "", auth)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.Zero(t, f.svc.Sessions())

	resp, _ = f.do(t, "POST", "/redfish/v1/SessionService/Sessions", `{"UserName":"admin","Password":"pw-7f3a"}`, "", nil)
	auth = map[string]string{"X-Auth-Token": resp.Header.Get("X-Auth-Token")}
	resp, _ = f.do(t, "DELETE", resp.Header.Get("Location"), "", "", auth)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	resp, _ = f.do(t, "GET", "/redfish/v1/Systems", "", "", auth)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

func TestVirtualMedia(t *testing.T) {
	t.Parallel()
	f := setup(t)
	_, mgr := f.do(t, "GET", "/redfish/v1/Managers/BMC", "", "admin", nil)
	require.Equal(t, "BMC", mgr["ManagerType"])
	_, coll := f.do(t, "GET", mgr["VirtualMedia"].(map[string]any)["@odata.id"].(string), "", "admin", nil)
	cdPath := coll["Members"].([]any)[0].(map[string]any)["@odata.id"].(string)
	_, cd := f.do(t, "GET", cdPath, "", "admin", nil)
	require.Equal(t, []any{"CD", "DVD"}, cd["MediaTypes"])
	require.Nil(t, cd["Image"])
	actions := cd["Actions"].(map[string]any)
	insert := actions["#VirtualMedia.InsertMedia"].(map[string]any)["target"].(string)
	eject := actions["#VirtualMedia.EjectMedia"].(map[string]any)["target"].(string)

	resp, _ := f.do(t, "POST", insert, `{"Image":"http://10.0.0.1/ramdisk.iso","Inserted":true}`, "admin", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	_, cd = f.do(t, "GET", cdPath, "", "admin", nil)
	require.Equal(t, "http://10.0.0.1/ramdisk.iso", cd["Image"])
	require.Equal(t, true, cd["Inserted"])
	resp, body := f.do(t, "POST", insert, `{"Image":"http://10.0.0.1/other.iso"}`, "admin", nil)
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	requireError(t, body, "ResourceInUse")

	resp, _ = f.do(t, "POST", eject, `{}`, "admin", nil)
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	image, inserted := f.svc.Media()
	require.Empty(t, image)
	require.False(t, inserted)
}

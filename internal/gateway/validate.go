package gateway

import (
	"math"
	"regexp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/better-compute/better-compute/gen/bettercompute/agent/v1"
	"github.com/better-compute/better-compute/internal/fleet"
	"github.com/better-compute/better-compute/internal/gpuhealth"
)

var (
	hexDigestRE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
	failureCodeRE = regexp.MustCompile(`^[A-Z0-9_]{0,64}$`)
	tokenRE       = regexp.MustCompile(`^[A-Za-z0-9._:/+-]*$`)
)

// Sections are the inventory section names the gateway knows.
var Sections = []string{"system", "gpus", "cpus", "memory", "labels"}

// Field limits on agent messages.
const (
	maxShort       = 128
	maxMessage     = 4096
	maxListItems   = 64
	maxResultBytes = 64 << 10
)

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// ValidateAgentMessage checks an agent message's shape before the gateway
// acts on it: exactly one kind, known enum values, bounded strings and
// lists, well-formed digests. It never reads the database. A failure is an
// INVALID_ARGUMENT status naming the field. A message that passes has its
// free text (command update and health event messages, cgroup paths)
// defused in place by fleet.SanitizeNodeText before anything stores it.
func ValidateAgentMessage(m *agentv1.AgentMessage) error {
	if err := validateAgentMessage(m); err != nil {
		return err
	}
	if _, beat := m.GetMsg().(*agentv1.AgentMessage_Heartbeat); !beat {
		// Heartbeats carry no text; skipping them keeps the hot path free.
		fleet.SanitizeNodeText(m)
	}
	return nil
}

func validateAgentMessage(m *agentv1.AgentMessage) error {
	switch msg := m.GetMsg().(type) {
	case nil:
		return invalid("empty agent message: set one of hello, heartbeat, status, inventory, command_update, allocation_bound, allocation_released, goodbye, process_output")
	case *agentv1.AgentMessage_Hello:
		return validateHello(msg.Hello)
	case *agentv1.AgentMessage_Heartbeat:
		return validateHeartbeat(msg.Heartbeat)
	case *agentv1.AgentMessage_Status:
		return validateStatus(msg.Status)
	case *agentv1.AgentMessage_Inventory:
		return validateSectionShape(msg.Inventory)
	case *agentv1.AgentMessage_CommandUpdate:
		return validateCommandUpdate(msg.CommandUpdate)
	case *agentv1.AgentMessage_AllocationBound:
		b := msg.AllocationBound
		if err := validateAllocation(b.GetAllocationId(), b.GetCommandId()); err != nil {
			return err
		}
		if len(b.GetCgroup()) > maxMessage {
			return invalid("allocation_bound.cgroup: longer than %d bytes", maxMessage)
		}
		return validateEnforced(b.GetEnforced())
	case *agentv1.AgentMessage_AllocationReleased:
		r := msg.AllocationReleased
		return validateAllocation(r.GetAllocationId(), r.GetCommandId())
	case *agentv1.AgentMessage_Goodbye:
		return validShort("goodbye.reason", msg.Goodbye.GetReason(), false)
	case *agentv1.AgentMessage_ProcessOutput:
		return validateProcessOutput(msg.ProcessOutput)
	default:
		return invalid("unknown agent message kind %T", msg)
	}
}

// enforcedResources are the resources an AllocationBound reports on.
var enforcedResources = []string{"devices", "cpu", "memory", "cpuset"}

// clip shortens a refused value for its error message.
func clip(v string) string {
	if len(v) > 32 {
		return v[:32] + "…"
	}
	return v
}

func validateEnforced(es []*agentv1.Enforcement) error {
	seen := map[string]bool{}
	for _, e := range es {
		switch {
		case !slices.Contains(enforcedResources, e.GetResource()):
			return invalid("allocation_bound.enforced.resource: must be one of %s, got %q", strings.Join(enforcedResources, ", "), clip(e.GetResource()))
		case seen[e.GetResource()]:
			return invalid("allocation_bound.enforced: %s reported twice", e.GetResource())
		case e.GetState() == agentv1.EnforcementState_ENFORCEMENT_STATE_UNSPECIFIED:
			return invalid("allocation_bound.enforced.state: required for %s", e.GetResource())
		case agentv1.EnforcementState_name[int32(e.GetState())] == "":
			return invalid("allocation_bound.enforced.state: unknown state %d for %s", e.GetState(), e.GetResource())
		case len(e.GetDetail()) > maxMessage:
			return invalid("allocation_bound.enforced.detail: longer than %d bytes", maxMessage)
		}
		seen[e.GetResource()] = true
	}
	return nil
}

func validShort(field, v string, required bool) error {
	switch {
	case v == "" && required:
		return invalid("%s: required", field)
	case len(v) > maxShort:
		return invalid("%s: longer than %d bytes", field, maxShort)
	case !tokenRE.MatchString(v):
		return invalid("%s: only letters, digits and ._:/+- allowed", field)
	}
	return nil
}

func validateHello(h *agentv1.Hello) error {
	if err := validShort("hello.agent_version", h.GetAgentVersion(), false); err != nil {
		return err
	}
	if _, ok := agentv1.AgentMode_name[int32(h.GetMode())]; !ok {
		return invalid("hello.mode: unknown mode %d", h.GetMode())
	}
	if len(h.GetCapabilities()) > maxListItems {
		return invalid("hello.capabilities: more than %d", maxListItems)
	}
	for _, c := range h.GetCapabilities() {
		if err := validShort("hello.capabilities", c, true); err != nil {
			return err
		}
	}
	if h.GetTrustVersion() < 0 {
		return invalid("hello.trust_version: negative")
	}
	if h.GetLastAppliedSeq() > math.MaxInt64 {
		return invalid("hello.last_applied_seq: out of range")
	}
	if d := h.GetInventoryDigest(); d != "" && !hexDigestRE.MatchString(d) {
		return invalid("hello.inventory_digest: must be 64 lower-case hex digits")
	}
	if len(h.GetBmcDrivers()) > maxListItems {
		return invalid("hello.bmc_drivers: more than %d", maxListItems)
	}
	for _, d := range h.GetBmcDrivers() {
		if err := validateBMCDriver(d); err != nil {
			return err
		}
	}
	return nil
}

// validateBMCDriver checks one driver of a site agent's Hello. Its name is
// what machines' bmc_driver holds, so it takes the same shape; its path
// is text the API shows, bounded and defused like other node text.
func validateBMCDriver(d *agentv1.BMCDriver) error {
	if err := validShort("hello.bmc_drivers.name", d.GetName(), true); err != nil {
		return err
	}
	if strings.HasPrefix(d.GetName(), "plugin:") || strings.Contains(d.GetName(), "/") {
		return invalid("hello.bmc_drivers.name: a registry name, not a path")
	}
	for field, v := range map[string]string{"reports": d.GetReports(), "version": d.GetVersion()} {
		if err := validShort("hello.bmc_drivers."+field, v, false); err != nil {
			return err
		}
	}
	if len(d.GetPath()) > maxMessage || strings.ContainsFunc(d.GetPath(), func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return invalid("hello.bmc_drivers.path: longer than %d bytes or holds a control character", maxMessage)
	}
	if len(d.GetCapabilities()) > maxListItems {
		return invalid("hello.bmc_drivers.capabilities: more than %d", maxListItems)
	}
	for _, c := range d.GetCapabilities() {
		if err := validShort("hello.bmc_drivers.capabilities", c, true); err != nil {
			return err
		}
	}
	return nil
}

func validateStatus(s *agentv1.StatusReport) error {
	if !slices.Contains([]string{"", "ok", "degraded", "failed"}, s.GetHealth()) {
		return invalid("status.health: must be ok, degraded or failed")
	}
	for _, v := range []float64{s.GetPressure().GetCpu(), s.GetPressure().GetMemory(), s.GetPressure().GetIo()} {
		if math.IsNaN(v) || v < 0 || v > 100 {
			return invalid("status.pressure: values are percentages (0-100)")
		}
	}
	if len(s.GetEvents()) > maxListItems {
		return invalid("status.events: more than %d", maxListItems)
	}
	for _, e := range s.GetEvents() {
		if err := validateHealthEvent("status.events", e); err != nil {
			return err
		}
	}
	if len(s.GetFindings()) > maxListItems {
		return invalid("status.findings: more than %d", maxListItems)
	}
	for _, e := range s.GetFindings() {
		if err := validateHealthEvent("status.findings", e); err != nil {
			return err
		}
	}
	return nil
}

// maxProcessName bounds a health event's process name (the kernel's comm
// is 16 bytes). Its GPU index has telemetry's bound, maxGPUIndex.
const maxProcessName = 64

// validateHealthEvent checks one health event or finding. Its message and
// process name are the node's (a tenant names its own processes): they
// are defused with the rest of the message's text, not refused, so that a
// hostile process name cannot keep its GPU's XID from being recorded.
func validateHealthEvent(field string, e *agentv1.HealthEvent) error {
	if err := validShort(field+".kind", e.GetKind(), true); err != nil {
		return err
	}
	switch {
	case len(e.GetDevice()) > maxShort || len(e.GetMessage()) > maxMessage:
		return invalid("%s: device or message too long", field)
	case !slices.Contains([]string{"", gpuhealth.SeverityCritical, gpuhealth.SeverityError, gpuhealth.SeverityWarning, gpuhealth.SeverityInfo}, e.GetSeverity()):
		return invalid("%s.severity: must be critical, error, warning, info or empty", field)
	case e.GpuIndex != nil && (e.GetGpuIndex() < 0 || e.GetGpuIndex() > maxGPUIndex):
		return invalid("%s.gpu_index: must be 0-%d", field, maxGPUIndex)
	case e.GetPid() < 0 || e.GetPid() > math.MaxInt32:
		return invalid("%s.pid: must be a process id (0 for none)", field)
	case len(e.GetProcessName()) > maxProcessName:
		return invalid("%s.process_name: longer than %d bytes", field, maxProcessName)
	}
	return nil
}

// validateSectionShape checks an inventory section's fields without
// hashing or decoding it (DecodeSection does both).
func validateSectionShape(s *agentv1.InventorySection) error {
	switch {
	case !slices.Contains(Sections, s.GetName()):
		return invalid("inventory.name: unknown section %q (known: system, gpus, cpus, memory, labels)", truncate(s.GetName()))
	case len(s.GetData()) > MaxSectionBytes:
		return status.Errorf(codes.ResourceExhausted, "inventory section %q is %d bytes; the limit is %d", s.GetName(), len(s.GetData()), MaxSectionBytes)
	case !hexDigestRE.MatchString(s.GetSha256()):
		return invalid("inventory.sha256: must be 64 lower-case hex digits")
	case !hexDigestRE.MatchString(s.GetSnapshotDigest()):
		return invalid("inventory.snapshot_digest: must be 64 lower-case hex digits")
	case s.GetSectionCount() < 1 || int(s.GetSectionCount()) > len(Sections):
		return invalid("inventory.section_count: must be 1-%d, got %d", len(Sections), s.GetSectionCount())
	}
	return nil
}

func validateCommandUpdate(u *agentv1.CommandUpdate) error {
	if err := validShort("command_update.command_id", u.GetCommandId(), true); err != nil {
		return err
	}
	switch {
	case u.GetSeq() == 0 || u.GetSeq() > math.MaxInt64:
		return invalid("command_update.seq: must be a command's sequence number (> 0)")
	case u.GetState() == agentv1.CommandState_COMMAND_STATE_UNSPECIFIED:
		return invalid("command_update.state: required")
	case agentv1.CommandState_name[int32(u.GetState())] == "":
		return invalid("command_update.state: unknown state %d", u.GetState())
	case u.GetProgress() < 0 || u.GetProgress() > 100:
		return invalid("command_update.progress: must be 0-100")
	case len(u.GetTraceparent()) > maxTraceparent:
		return invalid("command_update.traceparent: longer than %d bytes", maxTraceparent)
	case len(u.GetMessage()) > maxMessage:
		return invalid("command_update.message: longer than %d bytes", maxMessage)
	case !failureCodeRE.MatchString(u.GetFailureCode()):
		return invalid("command_update.failure_code: must match [A-Z0-9_]{0,64}")
	case u.GetResult() != nil && proto.Size(u.GetResult()) > maxResultBytes:
		return invalid("command_update.result: larger than %d bytes", maxResultBytes)
	}
	return nil
}

// MaxProcessOutputBytes bounds one process_output chunk.
const MaxProcessOutputBytes = 32 << 10

func validateProcessOutput(o *agentv1.ProcessOutput) error {
	if err := validShort("process_output.command_id", o.GetCommandId(), true); err != nil {
		return err
	}
	switch {
	case o.GetSeq() == 0 || o.GetSeq() > math.MaxInt64:
		return invalid("process_output.seq: must be a command's sequence number (> 0)")
	case o.GetStream() != "stdout" && o.GetStream() != "stderr":
		return invalid("process_output.stream: must be stdout or stderr")
	case len(o.GetData()) > MaxProcessOutputBytes:
		return invalid("process_output.data: longer than %d bytes", MaxProcessOutputBytes)
	}
	return nil
}

func validateAllocation(allocationID, commandID string) error {
	if err := validShort("allocation_id", allocationID, true); err != nil {
		return err
	}
	return validShort("command_id", commandID, false)
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

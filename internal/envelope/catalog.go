package envelope

import (
	"sort"

	"github.com/better-compute/better-compute/gen/bettercompute/api/v1/apiv1connect"
)

// Kind says which pipeline a method runs through.
type Kind int

// Method kinds.
const (
	// KindMutation runs the full envelope: one decision, one transaction.
	KindMutation Kind = iota + 1
	// KindRead makes a (cached) read decision.
	KindRead
	// KindSelf only authenticates: it tells the caller about itself.
	KindSelf
)

// Method is one row of the service catalog: which IAM action guards a
// procedure and how it is processed. Every procedure the API serves has a
// row; a repository test fails when one is missing.
type Method struct {
	Procedure string
	Action    string
	Kind      Kind
	// Create methods honour the Idempotency-Key header.
	Create bool
}

var catalog = []Method{
	{apiv1connect.TenantServiceCreateProcedure, "tenants.create", KindMutation, true},
	{apiv1connect.TenantServiceGetProcedure, "tenants.get", KindRead, false},
	{apiv1connect.TenantServiceListProcedure, "tenants.list", KindRead, false},
	{apiv1connect.TenantServiceSuspendProcedure, "tenants.suspend", KindMutation, false},
	{apiv1connect.TenantServiceResumeProcedure, "tenants.resume", KindMutation, false},
	{apiv1connect.TenantServiceDeleteProcedure, "tenants.delete", KindMutation, false},
	{apiv1connect.ProjectServiceCreateProcedure, "projects.create", KindMutation, true},
	{apiv1connect.ProjectServiceGetProcedure, "projects.get", KindRead, false},
	{apiv1connect.ProjectServiceListProcedure, "projects.list", KindRead, false},
	{apiv1connect.ProjectServiceDeleteProcedure, "projects.delete", KindMutation, false},
	{apiv1connect.ApiKeyServiceCreateProcedure, "apiKeys.create", KindMutation, true},
	{apiv1connect.ApiKeyServiceListProcedure, "apiKeys.list", KindRead, false},
	{apiv1connect.ApiKeyServiceRevokeProcedure, "apiKeys.revoke", KindMutation, false},
	{apiv1connect.IdentityServiceWhoAmIProcedure, "", KindSelf, false},
	{apiv1connect.PolicyServiceGetProcedure, "policies.get", KindRead, false},
	{apiv1connect.PolicyServicePutProcedure, "policies.put", KindMutation, false},
	{apiv1connect.PolicyServiceListProcedure, "policies.list", KindRead, false},
	{apiv1connect.ConfirmationServiceListProcedure, "confirmations.list", KindRead, false},
	{apiv1connect.ConfirmationServiceApproveProcedure, "confirmations.approve", KindMutation, false},
	{apiv1connect.AuditServiceListProcedure, "audit.list", KindRead, false},
	{apiv1connect.AuditServiceGetCheckpointProcedure, "audit.prove", KindRead, false},
	{apiv1connect.AuditServiceGetLogKeyProcedure, "audit.prove", KindRead, false},
	{apiv1connect.AuditServiceProveInclusionProcedure, "audit.prove", KindRead, false},
	{apiv1connect.AuditServiceProveConsistencyProcedure, "audit.prove", KindRead, false},
	{apiv1connect.AuditServiceCheckLogProcedure, "audit.check", KindRead, false},
	{apiv1connect.EventServiceWatchProcedure, "events.watch", KindRead, false},
	{apiv1connect.EventServiceListProcedure, "events.list", KindRead, false},
	{apiv1connect.NodeServiceListProcedure, "nodes.list", KindRead, false},
	{apiv1connect.NodeServiceGetProcedure, "nodes.get", KindRead, false},
	{apiv1connect.NodeServiceDrainProcedure, "nodes.drain", KindMutation, false},
	{apiv1connect.NodeServiceUndrainProcedure, "nodes.undrain", KindMutation, false},
	{apiv1connect.NodeServiceDeleteProcedure, "nodes.delete", KindMutation, false},
	{apiv1connect.CommandServiceRunProcedure, "commands.run", KindMutation, true},
	{apiv1connect.CommandServiceGetProcedure, "commands.get", KindRead, false},
	{apiv1connect.CommandServiceListProcedure, "commands.list", KindRead, false},
	{apiv1connect.CommandServiceCancelProcedure, "commands.cancel", KindMutation, false},
	{apiv1connect.CommandBatchServiceCreateProcedure, "commandBatches.create", KindMutation, true},
	{apiv1connect.CommandBatchServiceGetProcedure, "commandBatches.get", KindRead, false},
	{apiv1connect.CommandBatchServiceListProcedure, "commandBatches.list", KindRead, false},
	{apiv1connect.CommandBatchServiceApproveProcedure, "commandBatches.approve", KindMutation, false},
	{apiv1connect.CommandBatchServiceCancelProcedure, "commandBatches.cancel", KindMutation, false},
	{apiv1connect.CommandBatchServiceRunProcedure, "commandBatches.run", KindMutation, false},
	{apiv1connect.CommandBatchServicePutApproverSetProcedure, "approverSets.put", KindMutation, false},
	{apiv1connect.CommandBatchServiceGetApproverSetProcedure, "approverSets.get", KindRead, false},
	{apiv1connect.JoinTokenServiceCreateProcedure, "joinTokens.create", KindMutation, true},
	{apiv1connect.JoinTokenServiceListProcedure, "joinTokens.list", KindRead, false},
	{apiv1connect.JoinTokenServiceRevokeProcedure, "joinTokens.revoke", KindMutation, false},
	{apiv1connect.TrustAnchorServiceCreateProcedure, "trustAnchors.create", KindMutation, true},
	{apiv1connect.TrustAnchorServiceListProcedure, "trustAnchors.list", KindRead, false},
	{apiv1connect.TrustAnchorServiceDeleteProcedure, "trustAnchors.delete", KindMutation, false},
	{apiv1connect.JoinRequestServiceListProcedure, "joinRequests.list", KindRead, false},
	{apiv1connect.JoinRequestServiceApproveProcedure, "joinRequests.approve", KindMutation, false},
	{apiv1connect.JoinRequestServiceRejectProcedure, "joinRequests.reject", KindMutation, false},
	{apiv1connect.InventoryServiceGetProcedure, "inventory.get", KindRead, false},
	{apiv1connect.HealthServiceGetNodeHealthProcedure, "health.get", KindRead, false},
	{apiv1connect.HealthServiceListFindingsProcedure, "health.listFindings", KindRead, false},
	{apiv1connect.HealthServiceListRemediationsProcedure, "health.listRemediations", KindRead, false},
	{apiv1connect.HealthServiceGetPoolHealthProcedure, "pools.health", KindRead, false},
	{apiv1connect.HealthServiceQuarantineGpuProcedure, "gpus.quarantine", KindMutation, false},
	{apiv1connect.HealthServiceLiftGpuProcedure, "gpus.lift", KindMutation, false},
	{apiv1connect.HealthServiceResetBreakerProcedure, "pools.resetBreaker", KindMutation, false},
	{apiv1connect.RolloutServiceCreateProcedure, "rollouts.create", KindMutation, true},
	{apiv1connect.RolloutServiceGetProcedure, "rollouts.get", KindRead, false},
	{apiv1connect.RolloutServiceListProcedure, "rollouts.list", KindRead, false},
	{apiv1connect.RolloutServicePauseProcedure, "rollouts.pause", KindMutation, false},
	{apiv1connect.RolloutServiceResumeProcedure, "rollouts.resume", KindMutation, false},
	{apiv1connect.RolloutServiceAbortProcedure, "rollouts.abort", KindMutation, false},
	{apiv1connect.PoolServiceCreateProcedure, "pools.create", KindMutation, true},
	{apiv1connect.PoolServiceUpdateProcedure, "pools.update", KindMutation, false},
	{apiv1connect.PoolServiceGetProcedure, "pools.get", KindRead, false},
	{apiv1connect.PoolServiceListProcedure, "pools.list", KindRead, false},
	{apiv1connect.PoolServiceArchiveProcedure, "pools.archive", KindMutation, false},
	{apiv1connect.PoolServiceOfferProcedure, "pools.offer", KindMutation, false},
	{apiv1connect.ReservationServiceCreateProcedure, "reservations.create", KindMutation, true},
	// An array is decided as one create, its count in the decision's context.
	{apiv1connect.ReservationServiceCreateReservationsProcedure, "reservations.create", KindMutation, true},
	{apiv1connect.ReservationServicePreviewProcedure, "reservations.preview", KindRead, false},
	{apiv1connect.ReservationServiceGetProcedure, "reservations.get", KindRead, false},
	{apiv1connect.ReservationServiceListProcedure, "reservations.list", KindRead, false},
	{apiv1connect.ReservationServiceWatchProcedure, "reservations.watch", KindRead, false},
	{apiv1connect.ReservationServiceExtendProcedure, "reservations.extend", KindMutation, false},
	{apiv1connect.ReservationServiceReleaseProcedure, "reservations.release", KindMutation, false},
	{apiv1connect.ReservationServiceCancelProcedure, "reservations.cancel", KindMutation, false},
	{apiv1connect.ReservationServiceExecProcedure, "reservations.exec", KindMutation, false},
	{apiv1connect.QuotaServiceSetProcedure, "quotas.set", KindMutation, false},
	{apiv1connect.QuotaServiceGetProcedure, "quotas.get", KindRead, false},
	{apiv1connect.QuotaServiceListProcedure, "quotas.list", KindRead, false},
	{apiv1connect.BudgetServiceSetProcedure, "budgets.set", KindMutation, false},
	{apiv1connect.BudgetServiceGetProcedure, "budgets.get", KindRead, false},
	{apiv1connect.BudgetServiceListProcedure, "budgets.list", KindRead, false},
	{apiv1connect.BudgetServiceDeleteProcedure, "budgets.delete", KindMutation, false},
	{apiv1connect.CapacityServiceSummaryProcedure, "capacity.summary", KindRead, false},
	{apiv1connect.CapacityServiceByPoolProcedure, "capacity.byPool", KindRead, false},
	{apiv1connect.CapacityServiceByConsumerProcedure, "capacity.byConsumer", KindRead, false},
	{apiv1connect.CapacityServiceTimelineProcedure, "capacity.timeline", KindRead, false},
	{apiv1connect.CapacityServiceRebuildProcedure, "capacity.rebuild", KindMutation, false},
	{apiv1connect.UsageServiceListProcedure, "usage.list", KindRead, false},
	{apiv1connect.UsageServiceExportProcedure, "usage.export", KindRead, false},
	// A token is a credential: issued as a mutation, so it is decided on
	// the workload and audited.
	{apiv1connect.WorkloadIdentityServiceIssueTokenProcedure, "workloadTokens.issue", KindMutation, false},
	{apiv1connect.ImageServicePushProcedure, "images.push", KindMutation, true},
	{apiv1connect.ImageServiceGetProcedure, "images.get", KindRead, false},
	{apiv1connect.ImageServiceListProcedure, "images.list", KindRead, false},
	{apiv1connect.ImageServicePullProcedure, "images.pull", KindRead, false},
	{apiv1connect.ImageServiceSignProcedure, "images.sign", KindMutation, false},
	{apiv1connect.ImageServicePromoteProcedure, "images.promote", KindMutation, false},
	{apiv1connect.ImageServiceDeleteProcedure, "images.delete", KindMutation, false},
	{apiv1connect.ReleaseServiceCreateProcedure, "releases.create", KindMutation, true},
	{apiv1connect.ReleaseServiceGetProcedure, "releases.get", KindRead, false},
	{apiv1connect.ReleaseServiceListProcedure, "releases.list", KindRead, false},
	{apiv1connect.ReleaseServiceDeleteProcedure, "releases.delete", KindMutation, false},
	{apiv1connect.SignerKeyServiceAddProcedure, "signerKeys.add", KindMutation, true},
	{apiv1connect.SignerKeyServiceListProcedure, "signerKeys.list", KindRead, false},
	{apiv1connect.SignerKeyServiceRemoveProcedure, "signerKeys.remove", KindMutation, false},
	{apiv1connect.SiteServiceCreateProcedure, "sites.create", KindMutation, true},
	{apiv1connect.SiteServiceGetProcedure, "sites.get", KindRead, false},
	{apiv1connect.SiteServiceListProcedure, "sites.list", KindRead, false},
	{apiv1connect.SiteServiceUpdateProcedure, "sites.update", KindMutation, false},
	{apiv1connect.SiteServiceDeleteProcedure, "sites.delete", KindMutation, false},
	{apiv1connect.SiteServiceListDriversProcedure, "sites.listDrivers", KindRead, false},
	{apiv1connect.MachineServiceEnrollProcedure, "machines.enroll", KindMutation, true},
	{apiv1connect.MachineServiceGetProcedure, "machines.get", KindRead, false},
	{apiv1connect.MachineServiceListProcedure, "machines.list", KindRead, false},
	{apiv1connect.MachineServiceInspectProcedure, "machines.inspect", KindMutation, false},
	{apiv1connect.MachineServiceCommissionProcedure, "machines.commission", KindMutation, false},
	{apiv1connect.MachineServiceDeployProcedure, "machines.deploy", KindMutation, false},
	{apiv1connect.MachineServiceReleaseProcedure, "machines.release", KindMutation, false},
	{apiv1connect.MachineServiceRetireProcedure, "machines.retire", KindMutation, false},
	{apiv1connect.MachineServiceRescueProcedure, "machines.rescue", KindMutation, false},
	{apiv1connect.MachineServicePowerProcedure, "machines.power", KindMutation, false},
	{apiv1connect.MachineServiceRotateBMCPasswordProcedure, "machines.rotateBMC", KindMutation, false},
	{apiv1connect.MachineServiceGetPowerStatusProcedure, "machines.powerStatus", KindRead, false},
	{apiv1connect.MachineServiceAbortProcedure, "machines.abort", KindMutation, false},
	{apiv1connect.MachineServicePauseWorkflowProcedure, "machines.pauseWorkflow", KindMutation, false},
	{apiv1connect.MachineServiceResumeWorkflowProcedure, "machines.resumeWorkflow", KindMutation, false},
	{apiv1connect.MachineServiceRetryWorkflowProcedure, "machines.retryWorkflow", KindMutation, false},
	{apiv1connect.MachineServiceAbortWorkflowProcedure, "machines.abortWorkflow", KindMutation, false},
	{apiv1connect.MachineServiceListWorkflowsProcedure, "machines.listWorkflows", KindRead, false},
	{apiv1connect.MachineServiceGetWorkflowProcedure, "machines.getWorkflow", KindRead, false},
	{apiv1connect.MachineServiceLeaseProcedure, "machines.lease", KindMutation, true},
	{apiv1connect.MachineServiceAcceptLeaseProcedure, "machines.acceptLease", KindMutation, false},
	{apiv1connect.MachineServiceReleaseLeaseProcedure, "machines.releaseLease", KindMutation, false},
	{apiv1connect.MachineServiceGetLeaseProcedure, "machines.getLease", KindRead, false},
	{apiv1connect.FlavorServiceCreateProcedure, "flavors.create", KindMutation, true},
	{apiv1connect.FlavorServiceGetProcedure, "flavors.get", KindRead, false},
	{apiv1connect.FlavorServiceListProcedure, "flavors.list", KindRead, false},
	{apiv1connect.FlavorServiceDeleteProcedure, "flavors.delete", KindMutation, false},
	{apiv1connect.IPPoolServiceCreateProcedure, "ipPools.create", KindMutation, true},
	{apiv1connect.IPPoolServiceGetProcedure, "ipPools.get", KindRead, false},
	{apiv1connect.IPPoolServiceListProcedure, "ipPools.list", KindRead, false},
	{apiv1connect.IPPoolServiceListLeasesProcedure, "ipPools.listLeases", KindRead, false},
	{apiv1connect.IPPoolServiceDeleteProcedure, "ipPools.delete", KindMutation, false},
	{apiv1connect.InstanceServiceCreateProcedure, "instances.create", KindMutation, true},
	{apiv1connect.InstanceServiceGetProcedure, "instances.get", KindRead, false},
	{apiv1connect.InstanceServiceListProcedure, "instances.list", KindRead, false},
	{apiv1connect.InstanceServiceWatchProcedure, "instances.watch", KindRead, false},
	{apiv1connect.InstanceServiceStartProcedure, "instances.start", KindMutation, false},
	{apiv1connect.InstanceServiceStopProcedure, "instances.stop", KindMutation, false},
	{apiv1connect.InstanceServiceRebootProcedure, "instances.reboot", KindMutation, false},
	{apiv1connect.InstanceServiceDeleteProcedure, "instances.delete", KindMutation, false},
	{apiv1connect.InstanceServiceSshProcedure, "instances.ssh", KindMutation, false},
	{apiv1connect.VolumeServiceCreateProcedure, "volumes.create", KindMutation, true},
	{apiv1connect.VolumeServiceGetProcedure, "volumes.get", KindRead, false},
	{apiv1connect.VolumeServiceListProcedure, "volumes.list", KindRead, false},
	{apiv1connect.VolumeServiceAttachProcedure, "volumes.attach", KindMutation, false},
	{apiv1connect.VolumeServiceDetachProcedure, "volumes.detach", KindMutation, false},
	{apiv1connect.VolumeServiceDeleteProcedure, "volumes.delete", KindMutation, false},
	{apiv1connect.SandboxTemplateServiceCreateProcedure, "sandboxTemplates.create", KindMutation, true},
	{apiv1connect.SandboxTemplateServiceGetProcedure, "sandboxTemplates.get", KindRead, false},
	{apiv1connect.SandboxTemplateServiceListProcedure, "sandboxTemplates.list", KindRead, false},
	{apiv1connect.SandboxTemplateServiceDeleteProcedure, "sandboxTemplates.delete", KindMutation, false},
	{apiv1connect.SandboxServiceCreateProcedure, "sandboxes.create", KindMutation, true},
	{apiv1connect.SandboxServiceGetProcedure, "sandboxes.get", KindRead, false},
	{apiv1connect.SandboxServiceListProcedure, "sandboxes.list", KindRead, false},
	{apiv1connect.SandboxServiceExtendProcedure, "sandboxes.extend", KindMutation, false},
	{apiv1connect.SandboxServiceDeleteProcedure, "sandboxes.delete", KindMutation, false},
	{apiv1connect.SandboxServiceSnapshotProcedure, "sandboxes.snapshot", KindMutation, false},
	{apiv1connect.SandboxServiceExecProcedure, "sandboxes.exec", KindMutation, false},
	{apiv1connect.SandboxServiceRestoreProcedure, "sandboxes.restore", KindMutation, false},
	{apiv1connect.SandboxServiceListSnapshotsProcedure, "sandboxes.listSnapshots", KindRead, false},
	{apiv1connect.SandboxServiceDeleteSnapshotProcedure, "sandboxes.deleteSnapshot", KindMutation, false},
	{apiv1connect.SecretServicePutProcedure, "secrets.put", KindMutation, true},
	{apiv1connect.SecretServiceGetProcedure, "secrets.get", KindRead, false},
	{apiv1connect.SecretServiceListProcedure, "secrets.list", KindRead, false},
	{apiv1connect.SecretServiceDeleteProcedure, "secrets.delete", KindMutation, false},
	{apiv1connect.FleetConfigServiceSetMarkProcedure, "fleetMarks.set", KindMutation, false},
	{apiv1connect.FleetConfigServiceListMarksProcedure, "fleetMarks.list", KindRead, false},
	{apiv1connect.FleetConfigServiceDeleteMarkProcedure, "fleetMarks.delete", KindMutation, false},
	{apiv1connect.ProviderAccountServiceCreateProcedure, "providerAccounts.create", KindMutation, true},
	{apiv1connect.ProviderAccountServiceGetProcedure, "providerAccounts.get", KindRead, false},
	{apiv1connect.ProviderAccountServiceListProcedure, "providerAccounts.list", KindRead, false},
	{apiv1connect.ProviderAccountServiceDeleteProcedure, "providerAccounts.delete", KindMutation, false},
	{apiv1connect.ProviderAccountServiceListTypesProcedure, "providerAccounts.listTypes", KindRead, false},
	{apiv1connect.ProfileServiceCreateProcedure, "profiles.create", KindMutation, true},
	{apiv1connect.ProfileServiceGetProcedure, "profiles.get", KindRead, false},
	{apiv1connect.ProfileServiceListProcedure, "profiles.list", KindRead, false},
	{apiv1connect.ProfileServiceUpdateProcedure, "profiles.update", KindMutation, false},
	{apiv1connect.ProfileServiceDeleteProcedure, "profiles.delete", KindMutation, false},
	{apiv1connect.ProfileServiceValidateProcedure, "profiles.validate", KindRead, false},
	{apiv1connect.WebhookServiceCreateProcedure, "webhooks.create", KindMutation, true},
	{apiv1connect.WebhookServiceGetProcedure, "webhooks.get", KindRead, false},
	{apiv1connect.WebhookServiceListProcedure, "webhooks.list", KindRead, false},
	{apiv1connect.WebhookServiceUpdateProcedure, "webhooks.update", KindMutation, false},
	{apiv1connect.WebhookServiceDeleteProcedure, "webhooks.delete", KindMutation, false},
	{apiv1connect.WebhookServiceTestProcedure, "webhooks.test", KindMutation, false},
	{apiv1connect.WebhookServiceRotateSecretProcedure, "webhooks.rotateSecret", KindMutation, false},
	{apiv1connect.WebhookServiceListDeliveriesProcedure, "webhooks.listDeliveries", KindRead, false},
	{apiv1connect.WebhookServiceRedeliverProcedure, "webhooks.redeliver", KindMutation, false},
}

var catalogIndex = func() map[string]Method {
	m := make(map[string]Method, len(catalog))
	for _, row := range catalog {
		if _, dup := m[row.Procedure]; dup {
			panic("envelope: duplicate catalog row " + row.Procedure)
		}
		m[row.Procedure] = row
	}
	return m
}()

// Catalog returns every catalog row, sorted by procedure.
func Catalog() []Method {
	out := append([]Method(nil), catalog...)
	sort.Slice(out, func(i, j int) bool { return out[i].Procedure < out[j].Procedure })
	return out
}

// Lookup returns the catalog row of a procedure.
func Lookup(procedure string) (Method, bool) {
	m, ok := catalogIndex[procedure]
	return m, ok
}

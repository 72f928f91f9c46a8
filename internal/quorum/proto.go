package quorum

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/better-compute/better-compute/gen/bettercompute/api/v1"
	"github.com/better-compute/better-compute/internal/quorum/approval"
)

func digestHex(b []byte) string {
	d := sha256.Sum256(b)
	return hex.EncodeToString(d[:])
}

// batchProto renders a batch; leaves and approvals may be nil (lists).
func batchProto(b Batch, leaves []Leaf, approvals []Approval, now time.Time) *apiv1.CommandBatch {
	out := &apiv1.CommandBatch{
		Id: b.ID, TenantId: b.TenantID, State: b.StateAt(now), Root: b.Root, ApproverEpoch: b.Epoch, Threshold: int32(b.Threshold),
		TrustDomain: b.TrustDomain, Description: b.Description, CreatedBy: b.CreatedBy,
		CreateTime: timestamppb.New(b.CreateTime), ExpireTime: timestamppb.New(b.ExpireTime), UpdateTime: timestamppb.New(b.UpdateTime),
	}
	for _, l := range leaves {
		var m map[string]any
		// Stored params are canonical JSON of a Struct; they decode.
		_ = json.Unmarshal([]byte(l.Params), &m)
		st, _ := structpb.NewStruct(m)
		out.Leaves = append(out.Leaves, &apiv1.CommandBatchLeaf{Index: int32(l.Index), Kind: l.Kind, Subject: l.Subject,
			Params: st, ParamsSha256: l.ParamsSHA256, CommandId: l.CommandID, WorkflowId: l.WorkflowID})
	}
	for _, a := range approvals {
		out.Approvals = append(out.Approvals, &apiv1.BatchApproval{KeyId: a.KeyID, ApprovedBy: a.ApprovedBy, CreateTime: timestamppb.New(a.CreateTime)})
	}
	return out
}

func setProto(s ApproverSet, trustDomain string) *apiv1.ApproverSet {
	out := &apiv1.ApproverSet{TenantId: s.TenantID, Epoch: s.Epoch, Threshold: int32(s.Threshold), Digest: s.Digest,
		CreatedBy: s.CreatedBy, CreateTime: timestamppb.New(s.CreateTime), TrustDomain: trustDomain}
	for _, line := range s.Keys {
		k, err := approval.ParseKey(line)
		id := ""
		if err == nil {
			id = approval.KeyID(k)
		}
		out.Keys = append(out.Keys, &apiv1.ApproverKey{PublicKey: line, KeyId: id})
	}
	return out
}

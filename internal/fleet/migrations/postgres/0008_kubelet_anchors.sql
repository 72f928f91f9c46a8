-- Trust anchors for the kubelet attestor: a Kubernetes cluster's CA, whose
-- kubelet client certificates (CN=system:node:NAME) admit that cluster's
-- nodes (docs/attestation.md).
ALTER TABLE trust_anchors DROP CONSTRAINT trust_anchors_attestor_check;
ALTER TABLE trust_anchors ADD CONSTRAINT trust_anchors_attestor_check CHECK (attestor IN ('tpm', 'x509', 'cloud', 'kubelet'));

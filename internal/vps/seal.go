package vps

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/internal/envelope"
	"github.com/better-compute/better-compute/internal/fleet"
)

// Sealer seals user data, the seed's secrets and the SSH CA's key at rest (the PKI's sealer,
// AES-256-GCM from BETTER_COMPUTE_SECRET, as internal/secrets uses it).
type Sealer interface {
	Seal(ref string, plaintext []byte) ([]byte, error)
	Open(ref string, sealed []byte) ([]byte, error)
}

// userDataRef is what an instance row's user data is sealed under: a
// sealed value copied to another instance's row does not open.
func userDataRef(instanceID string) string { return "instance/" + instanceID + "/user_data" }

// seedRef is what a command's sealed seed is sealed under: the command's
// tenant and the host id of its instance, both read back from the row at
// delivery, so a blob moved to another tenant's or instance's command does
// not open.
func seedRef(tenantID, hostID string) string { return "instance-seed/" + tenantID + "/" + hostID }

// SealedSeedField is the seed field a stored instance.create carries its
// secret fields in, sealed (base64); the gateway opens it at delivery
// (OpenCreateParams), so bcd sees the plain vmcmd.Seed.
const SealedSeedField = "sealed"

// SeedSecrets are the vmcmd.Seed fields (JSON names) that never sit in a
// command row in the clear.
var SeedSecrets = []string{"user_data", "host_key"}

// errNoSealer refuses to store a secret in the clear.
var errNoSealer = envelope.Errorf(envelope.CodeFailedPrecondition,
	"user data and guest host keys are sealed at rest, and this control plane has no sealing secret (set BETTER_COMPUTE_SECRET)")

// sealUserData seals an instance's user data for its row; none stays none.
func (s *InstanceService) sealUserData(instanceID, userData string) ([]byte, error) {
	if userData == "" {
		return nil, nil
	}
	if s.sealer == nil {
		return nil, errNoSealer
	}
	b, err := s.sealer.Seal(userDataRef(instanceID), []byte(userData))
	if err != nil {
		return nil, fmt.Errorf("seal the user data of %s: %w", instanceID, err)
	}
	return b, nil
}

// sealSeed moves the secret fields of an instance.create's params (as
// paramsMap gives them) into one sealed field of its seed.
func (s *InstanceService) sealSeed(tenantID string, m map[string]any) error {
	seed, _ := m["seed"].(map[string]any)
	if seed == nil {
		return nil
	}
	secret := map[string]any{}
	for _, k := range SeedSecrets {
		if v, ok := seed[k]; ok {
			secret[k] = v
			delete(seed, k)
		}
	}
	if len(secret) == 0 {
		return nil
	}
	if s.sealer == nil {
		return errNoSealer
	}
	hostID, _ := m["instance_id"].(string)
	b, err := json.Marshal(secret)
	if err != nil {
		return err
	}
	sealed, err := s.sealer.Seal(seedRef(tenantID, hostID), b)
	if err != nil {
		return fmt.Errorf("seal the seed of %s: %w", hostID, err)
	}
	seed[SealedSeedField] = base64.StdEncoding.EncodeToString(sealed)
	return nil
}

// OpenCreateParams is the gateway's opener of instance.create: the seed's
// sealed field is opened back into its fields, for the agent's session
// only. Params without one (nothing secret) go out as stored; a sealed
// seed without a sealer, or one that does not open, is an error (the
// gateway fails the command rather than boot a guest without them).
func OpenCreateParams(sealer Sealer) fleet.ParamsOpener {
	return func(c fleet.Command) (string, error) {
		var m map[string]any
		if err := json.Unmarshal([]byte(c.Params), &m); err != nil {
			return "", fmt.Errorf("instance.create params: %w", err)
		}
		seed, _ := m["seed"].(map[string]any)
		v, ok := seed[SealedSeedField]
		if !ok {
			return c.Params, nil
		}
		if sealer == nil {
			return "", errors.New("instance.create: the seed is sealed and this control plane has no sealing secret (BETTER_COMPUTE_SECRET)")
		}
		str, _ := v.(string)
		sealed, err := base64.StdEncoding.DecodeString(str)
		if err != nil {
			return "", fmt.Errorf("instance.create: sealed seed: %w", err)
		}
		hostID, _ := m["instance_id"].(string)
		plain, err := sealer.Open(seedRef(c.TenantID, hostID), sealed)
		if err != nil {
			return "", fmt.Errorf("instance.create: open the seed: %w", err)
		}
		var secret map[string]any
		if err := json.Unmarshal(plain, &secret); err != nil {
			return "", fmt.Errorf("instance.create: sealed seed: %w", err)
		}
		delete(seed, SealedSeedField)
		for k, v := range secret {
			seed[k] = v
		}
		b, err := json.Marshal(m)
		if err != nil {
			return "", err
		}
		return string(b), nil
	}
}

// OpenUserData opens an instance row's sealed user data ("" when it has
// none).
func OpenUserData(sealer Sealer, in *Instance) (string, error) {
	if len(in.UserDataSealed) == 0 {
		return "", nil
	}
	if sealer == nil {
		return "", errors.New("the instance's user data is sealed and this control plane has no sealing secret")
	}
	b, err := sealer.Open(userDataRef(in.ID), in.UserDataSealed)
	if err != nil {
		return "", fmt.Errorf("open the user data of %s: %w", in.ID, err)
	}
	return string(b), nil
}

package fleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckKindForMode: each mode runs its own kinds only — a BMC call never
// reaches a node or a ramdisk, a wipe never a node, a node's work never a
// ramdisk.
func TestCheckKindForMode(t *testing.T) {
	for _, tt := range []struct {
		mode, kind string
		ok         bool
	}{
		{RoleNode, "allocation.bind", true},
		{RoleNode, KindInventoryRefresh, true},
		{RoleNode, KindDiskWipe, false},
		{RoleNode, "bmc.power", false},
		{"", "site.machines", false},
		{RoleRamdisk, KindDiskWipe, true},
		{RoleRamdisk, "allocation.bind", false},
		{RoleRamdisk, "bmc.power", false},
		{RoleSite, "bmc.power", true},
		{RoleSite, "site.machines", true},
	} {
		err := CheckKindForMode(tt.mode, tt.kind)
		if tt.ok {
			require.NoError(t, err, "%s may run %s", tt.mode, tt.kind)
		} else {
			require.Error(t, err, "%s must not run %s", tt.mode, tt.kind)
		}
	}
}

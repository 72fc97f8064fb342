package tap

import "testing"

// SetAfterConfigure installs a hook that runs at the end of a successful
// configure, for the rest of the test.
func SetAfterConfigure(t *testing.T, hook func(name string) error) {
	afterConfigure = hook
	t.Cleanup(func() { afterConfigure = nil })
}

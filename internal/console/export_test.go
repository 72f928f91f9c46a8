package console

// NavPaths is every page the console's navigation names, for the tests of
// package console_test.
func NavPaths() []string {
	out := make([]string, 0, len(navItems))
	for _, it := range navItems {
		out = append(out, it.Path)
	}
	return out
}

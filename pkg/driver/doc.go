// Package driver is Better Compute's SDK for out-of-process BMC drivers:
// a driver is a separate program the site agent starts as a child process
// and talks to over gRPC (hashicorp/go-plugin), so a site can drive a BMC
// the built-in "ipmi" and "redfish" drivers do not know without
// rebuilding the agent.
//
// # Writing a driver
//
// Implement BMCDriver (Info and Open) and BMC (the power, boot and media
// calls for one BMC), optionally PasswordSetter, and serve it from main:
//
//	func main() {
//		log := driver.NewLogger(slog.LevelInfo) // before ServeBMC
//		driver.ServeBMC(myDriver{log: log})
//	}
//
// Open gets a Target (address, user name, password, timeout) for each BMC
// the host opens; return an *Error with one of the Err* kinds from every
// call, so the host can tell bad credentials from an unreachable BMC from
// an unsupported operation. examples/bmc-driver in this repository serves
// the agent's IPMI driver this way.
//
// # Running a driver
//
// A host calls OpenBMC (one BMC) or Launch and Client.Open (many). The
// child gets a magic cookie in its environment and the protocol versions
// the host speaks; it answers with the version it serves and a unix
// socket, and both ends pin each other with one-time TLS certificates.
// A binary without the cookie exits at once; a driver of another protocol
// version is refused with an error naming both versions. The child does
// not inherit the host's environment: it gets PATH, TMPDIR and
// Options.Env.
//
// # Secrets
//
// This package must never log or return a BMC password. Target redacts
// itself when printed; the host scrubs every password it handed a driver
// from the driver's log lines, output and errors, and the driver side
// scrubs a session's passwords from errors before they cross. The
// password crosses the process boundary only inside Open and SetPassword.
//
// This package must not import the agent's own packages (anything under
// internal/): third parties build drivers with it alone.
package driver

// Package server is the `better-compute serve` process: from Options (one
// field per flag, filled by the CLI) it builds the app's configuration and
// logger, checks the liveness timeouts, binds the API, gateway and replica
// listeners before anything is written, bootstraps an empty database into a
// private key file, and runs the roles until the context ends. The pieces
// dev shares (Bind, Logger, AppConfig, WriteSecretFile) are exported for
// package devrig.
//
// It must never read flags or the environment (the CLI does, so the
// precedence of where a setting comes from stays in one place), and never
// print or log a secret: the first admin key goes only to its file.
package server

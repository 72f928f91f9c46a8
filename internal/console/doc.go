// Package console is the web console the API listener serves at /console:
// server-rendered HTML (templ) with htmx, both embedded in the binary.
//
// A person signs in by pasting an API key once; the console checks it with
// IdentityService.WhoAmI, keeps it sealed in a server-side session
// (console_sessions) behind an HttpOnly, SameSite=Strict cookie, and acts
// with it on every page. Every read and every action goes through the
// public API, in process, with that key: the console never reads another
// module's tables, never decides authorization itself (it hides buttons a
// role cannot use, and the API still refuses a forged post), and never
// holds a credential of its own. Every response carries a strict
// Content-Security-Policy; no page has an inline script or style, and every
// POST must carry its session's CSRF token.
package console

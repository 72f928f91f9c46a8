// Package metal is the bare-metal API: sites (a tenant's provisioning
// networks) and machines (servers enrolled at a site with their BMC), and
// the machine lifecycle — enrolled → inspecting → commissioning → ready →
// deploying → deployed → releasing → ready, rescue (ended when it expires),
// retire — where every transition starts a workflow on the provision engine
// with the seed's profiles and the workflow's end moves the machine on.
//
// It must never talk to a BMC or a machine itself: every step goes to the
// site agent of the machine's site (SiteAgent), which refuses anything that
// is not an enrolled machine of that site. A BMC password is sealed the
// moment it arrives and is never returned by the API or written to a log.
package metal

package driver

// ServeWith serves impl with another magic cookie value or protocol
// version: a driver a host must refuse.
func ServeWith(impl BMCDriver, cookieValue string, version int) { serve(impl, cookieValue, version) }

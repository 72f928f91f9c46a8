package hcloudemu

import (
	"crypto/md5" //nolint:gosec // Hetzner's SSH key fingerprints are MD5, as ssh-keygen -E md5 prints them.
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/hetznercloud/hcloud-go/v2/hcloud/schema"
)

// The catalog: a fixed slice of Hetzner's public one, with its ids and
// shapes, enough for clients to resolve names and for Offers to page.

type location struct {
	id                     int64
	name, description      string
	country, city, zone    string
	latitude, longitude    float64
	datacenterID           int64
	datacenter, dcDescript string
}

var catalogLocations = []location{
	{1, "fsn1", "Falkenstein DC Park 1", "DE", "Falkenstein", "eu-central", 50.47612, 12.370071, 4, "fsn1-dc14", "Falkenstein 1 virtual DC 14"},
	{2, "nbg1", "Nuremberg DC Park 1", "DE", "Nuremberg", "eu-central", 49.452102, 11.076665, 2, "nbg1-dc3", "Nuremberg 1 virtual DC 3"},
	{3, "hel1", "Helsinki DC Park 1", "FI", "Helsinki", "eu-central", 60.169855, 24.938379, 3, "hel1-dc2", "Helsinki 1 virtual DC 2"},
	{4, "ash", "Ashburn, VA", "US", "Ashburn, VA", "us-east", 39.045821, -77.487073, 5, "ash-dc1", "Ashburn virtual DC 1"},
	{5, "hil", "Hillsboro, OR", "US", "Hillsboro, OR", "us-west", 45.54222, -122.951924, 6, "hil-dc1", "Hillsboro virtual DC 1"},
}

func locationByName(name string) (location, bool) {
	for _, l := range catalogLocations {
		if l.name == name {
			return l, true
		}
	}
	return location{}, false
}

func locationByDatacenter(dc string) (location, bool) {
	for _, l := range catalogLocations {
		if l.datacenter == dc {
			return l, true
		}
	}
	return location{}, false
}

// price is in ten-thousandths of a euro, net; gross adds 19% VAT.
type price struct {
	location        string
	hourly, monthly int64
}

type serverType struct {
	id                    int64
	name, description     string
	category              string
	cores                 int
	memory                float32
	disk                  int
	cpuType, architecture string
	prices                []price
}

var (
	eu  = []string{"fsn1", "nbg1", "hel1"}
	all = []string{"fsn1", "nbg1", "hel1", "ash", "hil"}
)

func prices(locations []string, hourly, monthly int64) []price {
	out := make([]price, 0, len(locations))
	for _, l := range locations {
		h, m := hourly, monthly
		if !strings.HasPrefix(l, "fsn") && !strings.HasPrefix(l, "nbg") && !strings.HasPrefix(l, "hel") {
			// The US locations cost a little more, as they do.
			h, m = h*6/5, m*6/5
		}
		out = append(out, price{location: l, hourly: h, monthly: m})
	}
	return out
}

var catalogServerTypes = []serverType{
	{22, "cx22", "CX22", "cost_optimized", 2, 4, 40, "shared", "x86", prices(eu, 60, 37900)},
	{23, "cx32", "CX32", "cost_optimized", 4, 8, 80, "shared", "x86", prices(eu, 110, 68000)},
	{24, "cx42", "CX42", "cost_optimized", 8, 16, 160, "shared", "x86", prices(eu, 270, 164000)},
	{45, "cax11", "CAX11", "cost_optimized", 2, 4, 40, "shared", "arm", prices(eu, 60, 37900)},
	{104, "cpx11", "CPX11", "regular_purpose", 2, 2, 40, "shared", "x86", prices(all, 70, 43500)},
	{105, "cpx21", "CPX21", "regular_purpose", 3, 4, 80, "shared", "x86", prices(all, 130, 75500)},
	{96, "ccx13", "CCX13", "general_purpose", 2, 8, 80, "dedicated", "x86", prices(all, 230, 148600)},
	{97, "ccx23", "CCX23", "general_purpose", 4, 16, 160, "dedicated", "x86", prices(all, 470, 297200)},
}

func serverTypeByName(name string) (serverType, bool) {
	for _, st := range catalogServerTypes {
		if st.name == name {
			return st, true
		}
	}
	return serverType{}, false
}

func serverTypeByID(id int64) (serverType, bool) {
	for _, st := range catalogServerTypes {
		if st.id == id {
			return st, true
		}
	}
	return serverType{}, false
}

func (st serverType) offeredIn(loc string) bool {
	for _, p := range st.prices {
		if p.location == loc {
			return true
		}
	}
	return false
}

type image struct {
	id                  int64
	name, description   string
	osFlavor, osVersion string
	architecture        string
}

var catalogImages = []image{
	{67794396, "ubuntu-22.04", "Ubuntu 22.04", "ubuntu", "22.04", "x86"},
	{161547269, "ubuntu-24.04", "Ubuntu 24.04", "ubuntu", "24.04", "x86"},
	{114690387, "debian-12", "Debian 12", "debian", "12", "x86"},
	{76766499, "rocky-9", "Rocky Linux 9", "rocky", "9", "x86"},
	{103908070, "ubuntu-22.04", "Ubuntu 22.04", "ubuntu", "22.04", "arm"},
	{161547270, "ubuntu-24.04", "Ubuntu 24.04", "ubuntu", "24.04", "arm"},
	{114690389, "debian-12", "Debian 12", "debian", "12", "arm"},
}

func imageByID(id int64) (image, bool) {
	for _, img := range catalogImages {
		if img.id == id {
			return img, true
		}
	}
	return image{}, false
}

// imageFor resolves an image the way the API does for a create or a
// rebuild: by id, or by name for the server type's architecture.
func imageFor(ref schema.IDOrName, architecture string) (image, bool) {
	for _, img := range catalogImages {
		if (ref.ID != 0 && img.id == ref.ID) || (ref.ID == 0 && img.name == ref.Name && img.architecture == architecture) {
			return img, true
		}
	}
	return image{}, false
}

// money formats ten-thousandths of a euro as Hetzner does ("0.0060000000").
func money(v int64) string {
	return fmt.Sprintf("%d.%04d000000", v/10000, v%10000)
}

// gross adds 19% VAT, rounded to the nearest ten-thousandth.
func gross(net int64) int64 { return (net*119 + 50) / 100 }

func schemaPrice(net int64) schema.Price {
	return schema.Price{Net: money(net), Gross: money(gross(net))}
}

func schemaLocation(l location) schema.Location {
	return schema.Location{
		ID: l.id, Name: l.name, Description: l.description, Country: l.country, City: l.city,
		Latitude: l.latitude, Longitude: l.longitude, NetworkZone: l.zone,
	}
}

func schemaServerTypePrices(st serverType) []schema.PricingServerTypePrice {
	out := make([]schema.PricingServerTypePrice, 0, len(st.prices))
	for _, p := range st.prices {
		out = append(out, schema.PricingServerTypePrice{
			Location:          p.location,
			PriceHourly:       schemaPrice(p.hourly),
			PriceMonthly:      schemaPrice(p.monthly),
			IncludedTraffic:   20 << 40,
			PricePerTBTraffic: schemaPrice(10000),
		})
	}
	return out
}

func schemaServerType(st serverType) schema.ServerType {
	out := schema.ServerType{
		ID: st.id, Name: st.name, Description: st.description, Category: st.category,
		Cores: st.cores, Memory: st.memory, Disk: st.disk, StorageType: "local",
		CPUType: st.cpuType, Architecture: st.architecture, Prices: schemaServerTypePrices(st),
	}
	for _, p := range st.prices {
		if l, ok := locationByName(p.location); ok {
			out.Locations = append(out.Locations, schema.ServerTypeLocation{ID: l.id, Name: l.name})
		}
	}
	return out
}

func schemaDatacenter(l location) schema.Datacenter {
	dc := schema.Datacenter{ID: l.datacenterID, Name: l.datacenter, Description: l.dcDescript, Location: schemaLocation(l)}
	dc.ServerTypes.Supported = []int64{}
	dc.ServerTypes.Available = []int64{}
	dc.ServerTypes.AvailableForMigration = []int64{}
	for _, st := range catalogServerTypes {
		if st.offeredIn(l.name) {
			dc.ServerTypes.Supported = append(dc.ServerTypes.Supported, st.id)
			dc.ServerTypes.Available = append(dc.ServerTypes.Available, st.id)
			dc.ServerTypes.AvailableForMigration = append(dc.ServerTypes.AvailableForMigration, st.id)
		}
	}
	return dc
}

// imageCreated is when the catalog's images were published.
var imageCreated = time.Date(2024, 4, 25, 0, 0, 0, 0, time.UTC)

func schemaImage(img image) schema.Image {
	name, version := img.name, img.osVersion
	created := imageCreated
	size := float32(5)
	return schema.Image{
		ID: img.id, Status: "available", Type: "system", Name: &name, Description: img.description,
		ImageSize: &size, DiskSize: 5, Created: &created, OSFlavor: img.osFlavor, OSVersion: &version,
		Architecture: img.architecture, RapidDeploy: true, Labels: map[string]string{},
	}
}

// fingerprint is an OpenSSH public key's MD5 fingerprint, colon-separated.
func fingerprint(publicKey string) string {
	fields := strings.Fields(publicKey)
	if len(fields) < 2 {
		return ""
	}
	raw, err := base64.StdEncoding.DecodeString(fields[1])
	if err != nil {
		return ""
	}
	sum := md5.Sum(raw) //nolint:gosec // the fingerprint's format, not a security use.
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02x", b)
	}
	return strings.Join(parts, ":")
}
